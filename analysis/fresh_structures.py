"""How new are fresh tasks? The discrete structures of a sticky family with S = d states (issue 34.2).

    python analysis/fresh_structures.py [--n-train 768000] [--seeds 0 1 2] [--n-unseen 512] [--streams pre-34|current]

In the sticky family with as many clusters as states (S = d, e.g. the inference record's S = 4, V = 8), a task's
hidden chain follows a permutation sigma of its states (probability 1 - rho of the next state, plus rho spread by a
Dirichlet), and state s reveals token reveal[s] (probability gamma, plus the uniform rest). State labels are not
observable: relabeling the states (reveal o pi, pi^-1 sigma pi) gives the same distribution over tokens. What a
task's tokens show of its discrete structure is the permutation tau = reveal o sigma o reveal^-1 on its token set:
C(V, S) token sets x S! permutations (70 x 24 = 1680 at S = 4, V = 8). Everything else a task draws (the rho part of
its transitions, its initial distribution) is continuous.

For each seed this draws the training stream of `hmm.n_tasks = 0` (fresh tasks: one task per training episode,
stream "fresh") and the unseen evaluation tasks (stream "unseen") as the record's code drew them, and prints how many
distinct structures the training stream holds, how often each is drawn, and how many unseen tasks have a structure the
training stream drew (and how often). --streams pre-34 (the default): the seed streams before issue 34.4 (data.seed
appended as a last key, so seed 0 is the unreplicated stream: the inference-regime record's code, ce43c83); current:
seeds.with_replicate. The family is the inference record's unless --set overrides it (the tiny preset's other keys).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np


def structures(W: np.ndarray, emission: np.ndarray) -> np.ndarray:
    """The code of each task's token-level structure (module docstring), from its W (n, S, d) with d = S and its
    emission (n, S, V): tau as a map on the V tokens (V marks a token outside the set), in base V + 1."""
    nxt = np.argmax(W, axis=2)  # (n, S): the next state (d = S: Q is the identity on clusters)
    reveal = np.argmax(emission, axis=2)  # (n, S): the token each state reveals
    n, V = emission.shape[0], emission.shape[2]
    tau = np.full((n, V), V, dtype=np.int64)
    tau[np.arange(n)[:, None], reveal] = np.take_along_axis(reveal, nxt, axis=1)
    return (tau * (V + 1) ** np.arange(V, dtype=np.int64)).sum(1)


def draw(h, n: int, stream: str, replicate: int, streams: str):
    """(W, emission) of n tasks of stream `stream`, replicate `replicate`, as make_mixture draws them (streams:
    'current', or 'pre-34': the replicate appended as a plain last key)."""
    from hmmscope.data import hmm, seeds

    h = dataclasses.replace(h, n_tasks=int(n))
    if streams == "current":
        mix = hmm.make_mixture(h, stream=stream, replicate=replicate)
        return mix.W, mix.emission
    keys = [h.seed, 0x484D4D, hmm._stream_code(stream)] + ([replicate] if replicate else [])
    rng = seeds.rng(*keys)  # pre-34: [.., code, 0] was [.., code], so replicate 0 is the unreplicated stream
    W, _ = hmm._sticky_factors(rng, n, h.n_states, h.rank, h.alpha, h.rho)
    O = hmm.emission_matrix(hmm.revealing_map(rng, n, h.n_states, h.n_tokens), h.n_tokens, h.gamma)
    return W, O


def summary(h, n_train: int, n_unseen: int, seed: int, streams: str) -> dict:
    tr = structures(*draw(h, n_train, "fresh", seed, streams))
    un = structures(*draw(h, n_unseen, "unseen", seed, streams))
    codes, counts = np.unique(tr, return_counts=True)
    times = dict(zip(codes.tolist(), counts.tolist()))
    got = np.array([times.get(int(c), 0) for c in un])
    return {"seed": seed, "n_train": n_train, "distinct": len(codes), "min": int(counts.min()),
            "median": float(np.median(counts)), "max": int(counts.max()), "n_unseen": n_unseen,
            "unseen_seen": int((got > 0).sum()), "unseen_min": int(got.min()), "unseen_max": int(got.max())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-train", type=int, default=768000)
    p.add_argument("--n-unseen", type=int, default=512)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--streams", choices=("pre-34", "current"), default="pre-34")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (hmm.*)")
    a = p.parse_args(argv)
    from math import comb, factorial

    from hmmscope.config import override, preset

    fam = {"hmm.family": "sticky", "hmm.n_states": 4, "hmm.rank": 4, "hmm.n_tokens": 8, "hmm.gamma": 0.8,
           "hmm.rho": 0.05}
    try:
        fam.update(dict(kv.split("=", 1) for kv in a.set))
        h = override(preset("tiny"), fam).hmm
    except (ValueError, KeyError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if h.family != "sticky" or h.rank != h.n_states or h.n_states > h.n_tokens or min(a.n_train, a.n_unseen) < 1:
        print("error: this count needs the sticky family with hmm.rank = hmm.n_states <= hmm.n_tokens and n >= 1",
              file=sys.stderr)
        return 2
    total = comb(h.n_tokens, h.n_states) * factorial(h.n_states)
    print(f"sticky, S = d = {h.n_states}, V = {h.n_tokens}: {total} token-level structures (token sets x orders); "
          f"streams: {a.streams}")
    for s in a.seeds:
        r = summary(h, a.n_train, a.n_unseen, s, a.streams)
        print(f"seed {s}: {r['n_train']} fresh training tasks hold {r['distinct']} distinct structures, each drawn "
              f"{r['min']}-{r['max']} times (median {r['median']:g}); {r['unseen_seen']} of {r['n_unseen']} unseen "
              f"tasks have a structure the training stream drew, {r['unseen_min']}-{r['unseen_max']} times")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
