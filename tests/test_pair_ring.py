"""A model of the two-group ring of `fp8mla.kernels.decode_sm90_pair` (no GPU): two groups take
alternate tiles from one ring of NS stages, each group refilling the stage of its tile i − 2
with tile i − 2 + NS at the top of its tile i, copies landing in any order and any interleaving
of the groups. Every tile a group consumes must be the one that landed in its stage, the
groups must always finish, and neither may lead the other by more than the ring's NS tiles (the
coupling the kernel relies on to end both groups, and every SM, together). The mbarriers are
modelled as the hardware's parity waits: a wait on parity p passes while the barrier's current
phase has the other parity.

The first form of the kernel (one barrier a stage, waiting for tile i − NS's phase and then
tile i's) hung on the H200 (h200-20261203-s29-5fdbb2c-pair-hang.log); the model finds its flaw —
a group whose tile landed before it waited reads the stage's next, pending phase as the one it
waits for — and passes the form the kernel now takes (`ring_slot`: two barriers a stage).
"""

import random

import pytest

from fp8mla.kernels.decode_sm90_pair import ring_slot


class Barrier:
    """An mbarrier of one expected arrival: armed by the copy's expect, completed when the copy
    lands."""

    def __init__(self):
        self.phase = 0  # the current (pending) phase; those before it completed
        self.armed = False

    def expect(self):
        assert not self.armed, "re-armed before its pending phase completed"
        self.armed = True

    def land(self):
        assert self.armed
        self.armed = False
        self.phase += 1

    def passes(self, parity: int) -> bool:
        return self.phase % 2 != parity


def two_barriers(i, ns):
    """The kernel's form: tile i's stage, and one wait on its turn's barrier."""
    stage, bar, parity = ring_slot(i, ns)
    return stage, bar, [(bar, parity)]


def one_barrier_double_wait(i, ns):
    """The first form: one barrier a stage; tile i − NS's parity, then tile i's."""
    stage, use = i % ns, i // ns
    return stage, stage, [(stage, (use % 2) ^ 1), (stage, use % 2)]


def run(n_tiles, ns, form, rng):
    """One random interleaving; returns the tiles each group consumed, in order. Raises
    AssertionError on a wrong tile read, an early re-arm, an overwrite of an unread stage, or
    a deadlock."""
    bars = [Barrier() for _ in range(2 * ns)]
    content = [None] * ns  # the tile each stage holds once landed
    unread = [None] * ns  # the tile issued into a stage and not yet consumed
    flight = []  # (tile, stage, barrier) of copies issued, not landed

    def issue(t):
        if t >= n_tiles:
            return
        stage, bar, _ = form(t, ns)
        assert unread[stage] is None, f"tile {t} overwrites unread tile {unread[stage]}"
        unread[stage] = t
        bars[bar].expect()
        flight.append((t, stage, bar))

    for t in range(ns):
        issue(t)
    # each group: the next tile's index j and where it is in the tile (0: refill, 1: waits)
    state = [{"j": 0, "at": 0, "wait": 0} for _ in range(2)]
    mine = [(n_tiles - g + 1) // 2 for g in range(2)]
    seen = [[], []]

    def step(g):  # one action of group g; False where it is blocked
        s = state[g]
        i = g + 2 * s["j"]
        if s["at"] == 0:
            if s["j"] > 0:
                issue(i - 2 + ns)
            s["at"] = 1
            return True
        stage, _, waits = form(i, ns)
        bar, parity = waits[s["wait"]]
        if not bars[bar].passes(parity):
            return False
        s["wait"] += 1
        if s["wait"] < len(waits):
            return True
        assert content[stage] == i, f"group {g} read tile {content[stage]} as tile {i}"
        # the coupling that evens the groups out: a group at tile i finds the other past tile
        # i − NS (which refilled this stage), so neither leads by more than the ring
        assert i < ns or (seen[1 - g] and seen[1 - g][-1] >= i - ns), (g, i, seen[1 - g][-1:])
        seen[g].append(i)
        unread[stage] = None
        s.update(j=s["j"] + 1, at=0, wait=0)
        return True

    while any(state[g]["j"] < mine[g] for g in range(2)) or flight:
        moves = [("g", g) for g in range(2) if state[g]["j"] < mine[g]]
        moves += [("land", k) for k in range(len(flight))]
        rng.shuffle(moves)
        for kind, x in moves:
            if kind == "land":
                t, stage, bar = flight.pop(x)
                content[stage] = t
                bars[bar].land()
                break
            if step(x):
                break
        else:
            raise AssertionError(f"deadlock: {state}, copies in flight {flight}")
    return seen


@pytest.mark.parametrize("ns", [3, 5, 7])
@pytest.mark.parametrize("n_tiles", [0, 1, 2, 3, 5, 6, 11, 40])
def test_two_barriers_a_stage_read_every_tile_once_in_any_interleaving(ns, n_tiles):
    rng = random.Random(ns * 1000 + n_tiles)
    for _ in range(200):
        seen = run(n_tiles, ns, two_barriers, rng)
        assert seen == [list(range(0, n_tiles, 2)), list(range(1, n_tiles, 2))]


def test_one_barrier_with_a_double_wait_is_caught():
    """The first form: some interleaving reads a stage before its tile landed or never
    returns — the model is able to fail."""
    rng = random.Random(0)
    failures = 0
    for _ in range(300):
        try:
            run(11, 5, one_barrier_double_wait, rng)
        except AssertionError:
            failures += 1
    assert failures > 0


def test_ring_slot_alternates_barriers_per_stage():
    """Tile i and tile i + NS share a stage but not a barrier; tiles i and i + 2NS share both,
    their waits a phase apart."""
    for ns in (3, 5):
        for i in range(4 * ns):
            s, b, p = ring_slot(i, ns)
            s1, b1, _ = ring_slot(i + ns, ns)
            s2, b2, p2 = ring_slot(i + 2 * ns, ns)
            assert s == s1 == s2 == i % ns and b != b1 and b == b2 and p2 == 1 - p


def test_an_even_ring_leaves_the_groups_uncoupled():
    """With an even NS each group refills only its own stages: reads stay correct but one group
    can run arbitrarily far ahead — why the kernel asserts an odd ring."""
    rng = random.Random(3)
    leads = 0
    for _ in range(100):
        try:
            run(40, 4, two_barriers, rng)
        except AssertionError as e:
            assert "read tile" not in str(e) and "deadlock" not in str(e), e
            leads += 1
    assert leads > 0
