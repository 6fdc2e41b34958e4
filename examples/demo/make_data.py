"""Write a few newline-delimited JSON files of orders into a folder (the demo's input).

    python examples/demo/make_data.py DIR [--files 20] [--rows 500] [--start 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--start", type=int, default=0, help="number of the first file (for a second delivery)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rng = random.Random(args.start)
    countries = ["CZ", "ID", "DE", "US", "BR", "JP"]
    for f in range(args.start, args.start + args.files):
        path = os.path.join(args.dir, f"orders-{f:05d}.json")
        with open(path + ".tmp", "w") as out:
            for r in range(args.rows):
                order = {
                    "order_id": f * args.rows + r,
                    "customer": f"c{rng.randrange(1000):04d}",
                    "country": rng.choice(countries),
                    "amount": round(rng.uniform(1, 500), 2),
                    "ts": f"2026-11-{1 + f % 28:02d}T{r % 24:02d}:{r % 60:02d}:00Z",
                }
                out.write(json.dumps(order) + "\n")
        os.replace(path + ".tmp", path)  # files appear whole, as a well-behaved producer writes them
    print(f"wrote {args.files} files x {args.rows} rows to {args.dir}")


if __name__ == "__main__":
    main()
