"""The errors a user's input causes (a recipe, a flag, a data record, an export directory).

All are ValueErrors whose message names the file, line, option or field; the ``memroute`` command prints
them as one line (routers/cli.py).
"""


class RouterConfigError(ValueError):
    """A router export whose router_config.json / calibration.json is missing or malformed (names the file)."""


class ExportTargetError(ValueError):
    """An export / save target that must not be replaced (it holds something other than a previous export)."""
