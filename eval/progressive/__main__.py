"""``python -m eval.progressive``: the same as ``memroute eval progressive``."""

from eval.progressive.run import main

if __name__ == "__main__":
    main()
