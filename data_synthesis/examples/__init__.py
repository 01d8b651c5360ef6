"""Worked examples: converters from public dataset layouts to the Episode JSONL of ``--corpus episodes``."""
