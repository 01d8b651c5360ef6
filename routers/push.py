"""``memroute push EXPORT_DIR REPO_ID [--private] [--revision BRANCH]``: upload a router export to the Hub.

    memroute push outputs/quickstart/router you/smollm2-sufficiency-router --private

The folder must be a memroute export (``router_config.json`` of a known router type and schema version, checked
before any network call). When an evaluation is found (``--eval_results FILE``, or ``eval_results.json`` in /
beside the export; memroute's ``eval sufficiency`` metrics.json is understood), the card's ``eval_results`` are
refreshed first. Then ``HfApi().create_repo`` (exist_ok), ``create_branch`` for a ``--revision`` other than main,
and one ``upload_folder`` commit. Credentials are huggingface_hub's own (``hf auth login`` or ``HF_TOKEN``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from routers.logs import get_logger

log = get_logger(__name__)

IGNORE = [".*", "**/.*", "__pycache__/*", "*.lock"]   # temp / lock / hidden files never go to the Hub


def check_export(export_dir: str | os.PathLike) -> dict:
    """``router_config.json`` of a memroute export (known router type, readable schema); errors name the file."""
    from routers.base import ROUTER_CONFIG, ROUTERS, read_router_config, RouterConfigError

    path = Path(export_dir)
    if not path.exists():
        raise FileNotFoundError(f"{export_dir}: no such directory (give a `memroute export ...` directory)")
    if not path.is_dir():
        raise NotADirectoryError(f"{export_dir}: not a directory (give a `memroute export ...` directory)")
    raw = read_router_config(path)
    if raw.get("router_type") not in ROUTERS:
        raise RouterConfigError(f"{path / ROUTER_CONFIG}: unknown router_type {raw.get('router_type')!r:.80}; "
                                f"known: {sorted(ROUTERS)}")
    return raw


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def push(export_dir: str | os.PathLike, repo_id: str, private: bool = False, revision: str | None = None,
         commit_message: str | None = None, eval_results: str | None = None, api=None) -> str:
    """Upload ``export_dir`` to ``repo_id``; returns the commit URL (or what ``upload_folder`` returned)."""
    from routers.cards import refresh_card

    raw = check_export(export_dir)
    metrics = None
    if eval_results:
        try:
            metrics = json.loads(Path(eval_results).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"--eval_results {eval_results}: unreadable ({getattr(err, 'msg', None) or err})") from None
    if refresh_card(export_dir, metrics) is not None:
        log.info("model card: eval_results updated")
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    repo_id = getattr(url, "repo_id", None) or repo_id  # the canonical id (namespace filled in)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    info = api.upload_folder(repo_id=repo_id, folder_path=str(export_dir), repo_type="model", revision=revision,
                             commit_message=commit_message or f"Upload memroute {raw['router_type']} router",
                             ignore_patterns=IGNORE)
    where = getattr(info, "commit_url", None) or str(info)
    log.info("pushed %s -> %s%s: %s", export_dir, repo_id, f"@{revision}" if revision else "", where)
    return where


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memroute push", description="Upload a memroute router export to the "
                                "Hugging Face Hub (create the repo if needed, one commit).")
    p.add_argument("export_dir", help="a `memroute export ...` directory")
    p.add_argument("repo_id", help="Hub model repo, e.g. you/my-router")
    p.add_argument("--private", action="store_true", help="create the repo private (an existing repo keeps its visibility)")
    p.add_argument("--revision", default=None, help="branch to push to (created from main when missing)")
    p.add_argument("--commit_message", default=None)
    p.add_argument("--eval_results", default=None,
                   help="evaluation JSON for the card's eval_results (default: eval_results.json in / beside the export)")
    return p


def main(argv=None) -> int:
    """``memroute push``: the only memroute command that goes online, so HF_HUB_OFFLINE=1 is an error here."""
    from routers.logs import setup_cli_logging

    setup_cli_logging()
    args = make_parser().parse_args(argv)
    check_export(args.export_dir)  # a wrong folder is reported before anything about the network
    if _hub_offline():
        raise ValueError("HF_HUB_OFFLINE is set: pushing needs the Hub; run `HF_HUB_OFFLINE=0 memroute push ...`")
    push(args.export_dir, args.repo_id, private=args.private, revision=args.revision,
         commit_message=args.commit_message, eval_results=args.eval_results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
