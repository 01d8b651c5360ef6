"""``python -m eval.bench``: the same as ``memroute bench``."""

from eval.bench.run import main

if __name__ == "__main__":
    main()
