"""Assignment strategies: balanced (count and weight), round-robin, and Flink's Kafka hash."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

from splitflow.api.assignment import (
    BalancedAssignment,
    HashAssignment,
    RoundRobinAssignment,
    flink_kafka_owner,
    java_string_hash,
)


@dataclass(frozen=True)
class S:
    split_id: str
    size: float = 1.0
    position: int = 0


def named(*names: str) -> list[S]:
    return [S(n) for n in names]


def by_id(assignment: Mapping[int, Sequence[S]]) -> dict[int, list[str]]:
    return {r: [s.split_id for s in ss] for r, ss in sorted(assignment.items())}


def sized(**sizes: float) -> list[S]:
    return [S(name, size) for name, size in sizes.items()]


# -- Java's String.hashCode and Flink's Kafka split owner ---------------------------------


def _java_hash_reference(text: str) -> int:
    """String.hashCode() the way Java computes it: int arithmetic over UTF-16 code units."""
    h = 0
    for unit in _utf16_units(text):
        h = _int32(31 * h + unit)
    return h


def _utf16_units(text: str) -> list[int]:
    units = []
    for ch in text:
        cp = ord(ch)
        if cp > 0xFFFF:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    return units


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("ab", 97 * 31 + 98),
        ("hello", 99162322),
        ("Aa", 2112),  # the classic collision: "Aa" and "BB" hash alike
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # wraps to Integer.MIN_VALUE
        ("orders", -1008770331),
        ("\U0001f600", 0xD83D * 31 + 0xDE00),  # outside the BMP: two UTF-16 code units
    ],
)
def test_java_string_hash_matches_java_values(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected
    assert _java_hash_reference(text) == expected


def test_java_string_hash_agrees_with_java_int_arithmetic_on_many_strings() -> None:
    rng = random.Random(31)
    alphabet = "abcXYZ019-_.éß中\U0001f600"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        value = java_string_hash(text)
        assert value == _java_hash_reference(text), text
        assert -(2**31) <= value < 2**31


@pytest.mark.parametrize(
    ("topic", "readers", "owners_of_partitions_0_to_4"),
    [
        # hash("hello") * 31 = 3074031982, wraps in Java; & 0x7FFFFFFF = 926548334; % 4 = 2
        ("hello", 4, [2, 3, 0, 1, 2]),
        # hash("orders") * 31 & 0x7FFFFFFF = 940374459; % 4 = 3, % 3 = 0, % 5 = 4
        ("orders", 4, [3, 0, 1, 2, 3]),
        ("orders", 3, [0, 1, 2, 0, 1]),
        ("orders", 5, [4, 0, 1, 2, 3]),
        # 97 * 31 = 3007; 3007 % 4 = 3
        ("a", 4, [3, 0, 1, 2, 3]),
        # MIN_VALUE * 31 has no low 31 bits: the start index is 0 for any reader count
        ("polygenelubricants", 3, [0, 1, 2, 0, 1]),
        ("polygenelubricants", 1, [0, 0, 0, 0, 0]),
    ],
)
def test_flink_kafka_owner_matches_flinks_get_split_owner(
    topic: str, readers: int, owners_of_partitions_0_to_4: list[int]
) -> None:
    assert [flink_kafka_owner(topic, p, readers) for p in range(5)] == owners_of_partitions_0_to_4


def test_flink_kafka_owner_equals_java_int_arithmetic() -> None:
    # Flink: ((topic.hashCode() * 31) & 0x7FFFFFFF) % numReaders, then + partition, % n.
    for topic in ["orders", "payments", "hello", "x", "topic-with-a-long-name-" * 3]:
        for n in range(1, 9):
            start = (_int32(_java_hash_reference(topic) * 31) & 0x7FFFFFFF) % n
            for partition in range(10):
                assert flink_kafka_owner(topic, partition, n) == (start + partition) % n


# -- HashAssignment -----------------------------------------------------------------------


def test_hash_assignment_gives_each_split_its_flink_owner_among_sorted_readers() -> None:
    strategy = HashAssignment[S](key=lambda s: (s.split_id.rsplit("-", 1)[0], int(s.split_id[-1])))
    out = strategy.assign(named("orders-0", "orders-1", "hello-0"), {40: 0, 10: 0, 30: 0, 20: 0})
    # readers sorted: [10, 20, 30, 40]; orders-0 -> index 3, orders-1 -> 0, hello-0 -> 2
    assert by_id(out) == {10: ["orders-1"], 30: ["hello-0"], 40: ["orders-0"]}


def test_hash_assignment_keys_by_split_id_and_partition_zero_by_default() -> None:
    out = HashAssignment[S]().assign(named("hello"), dict.fromkeys(range(4), 0.0))
    assert by_id(out) == {2: ["hello"]}


def test_hash_assignment_ignores_loads() -> None:
    strategy = HashAssignment[S]()
    out = strategy.assign(named("hello"), {0: 0.0, 1: 0.0, 2: 1000.0, 3: 0.0})
    assert by_id(out) == {2: ["hello"]}


def test_hash_assignment_skews_colliding_topics_where_balanced_does_not() -> None:
    # FLINK-31762: one-partition topics whose hashes collide all land on one reader.
    splits = named("Aa", "BB")
    loads = dict.fromkeys(range(4), 0.0)
    hashed = HashAssignment[S]().assign(splits, loads)
    balanced = BalancedAssignment[S]().assign(splits, loads)
    assert len(hashed) == 1
    assert by_id(balanced) == {0: ["Aa"], 1: ["BB"]}


def test_hash_redistribute_is_the_same_pure_function_of_split_and_parallelism() -> None:
    strategy = HashAssignment[S]()
    out = strategy.redistribute({0: named("hello"), 7: named("orders")}, [0, 1, 2, 3])
    assert by_id(out) == {2: ["hello"], 3: ["orders"]}


def test_hash_assignment_with_no_readers_assigns_nothing() -> None:
    assert HashAssignment[S]().assign(named("a"), {}) == {}


# -- RoundRobinAssignment -----------------------------------------------------------------


def test_round_robin_deals_in_turn_over_sorted_readers_ignoring_loads() -> None:
    out = RoundRobinAssignment[S]().assign(named("a", "b", "c", "d", "e"), {2: 9.0, 0: 0.0, 1: 5.0})
    assert by_id(out) == {0: ["a", "d"], 1: ["b", "e"], 2: ["c"]}


def test_round_robin_counter_is_global_across_calls() -> None:
    strategy = RoundRobinAssignment[S]()
    readers = {0: 0.0, 1: 0.0}
    assert by_id(strategy.assign(named("a", "b", "c"), readers)) == {0: ["a", "c"], 1: ["b"]}
    assert by_id(strategy.assign(named("d"), readers)) == {1: ["d"]}
    assert by_id(strategy.assign(named("e"), readers)) == {0: ["e"]}


def test_round_robin_redistribute_restarts_the_counter_and_deals_by_split_id() -> None:
    strategy = RoundRobinAssignment[S]()
    strategy.assign(named("x"), {0: 0.0, 1: 0.0})  # counter moved
    out = strategy.redistribute({1: named("c", "a"), 9: named("d")}, [0, 1, 2], named("b"))
    assert by_id(out) == {0: ["a", "d"], 1: ["b"], 2: ["c"]}


def test_round_robin_with_no_readers_assigns_nothing() -> None:
    assert RoundRobinAssignment[S]().assign(named("a"), {}) == {}


# -- BalancedAssignment.assign ------------------------------------------------------------


def test_balanced_gives_each_split_to_the_least_loaded_reader() -> None:
    out = BalancedAssignment[S]().assign(named("a", "b", "c"), {0: 5.0, 1: 0.0, 2: 1.0})
    assert by_id(out) == {1: ["a", "b"], 2: ["c"]}


def test_balanced_breaks_ties_by_lowest_reader_id() -> None:
    out = BalancedAssignment[S]().assign(named("a", "b", "c", "d", "e"), {2: 0.0, 1: 0.0, 0: 0.0})
    assert by_id(out) == {0: ["a", "d"], 1: ["b", "e"], 2: ["c"]}


def test_balanced_by_weight_deals_heaviest_first_to_the_lightest_reader() -> None:
    strategy = BalancedAssignment[S](weigh=lambda s: s.size)
    out = strategy.assign(sized(c=3, a=5, d=3, b=4), {0: 0.0, 1: 0.0})
    # a(5)->0, b(4)->1, c(3)->1 (4 < 5), d(3)->0 (5 < 7): loads 8 and 7
    assert by_id(out) == {0: ["a", "d"], 1: ["b", "c"]}


def test_balanced_weight_defaults_to_one_and_uses_weigh_when_given() -> None:
    assert BalancedAssignment[S]().weight(S("a", 42)) == 1.0
    assert BalancedAssignment[S](weigh=lambda s: s.size).weight(S("a", 42)) == 42.0


def test_balanced_with_no_readers_assigns_nothing() -> None:
    assert BalancedAssignment[S]().assign(named("a"), {}) == {}


def test_balanced_assign_returns_only_readers_that_get_splits() -> None:
    out = BalancedAssignment[S]().assign(named("a"), {0: 0.0, 1: 0.0, 2: 0.0})
    assert list(out) == [0]


# -- BalancedAssignment.redistribute ------------------------------------------------------


def _moves(held: Mapping[int, Sequence[S]], out: Mapping[int, Sequence[S]]) -> int:
    holder = {s.split_id: r for r, ss in held.items() for s in ss}
    return sum(1 for r, ss in out.items() for s in ss if holder.get(s.split_id) != r)


def test_redistribute_keeps_a_balanced_assignment_exactly_as_it_is() -> None:
    held = {0: named("a", "b"), 1: named("c", "d"), 2: named("e")}
    out = BalancedAssignment[S]().redistribute(held, [0, 1, 2])
    assert by_id(out) == {0: ["a", "b"], 1: ["c", "d"], 2: ["e"]}


def test_redistribute_keeps_a_balanced_weighted_assignment_exactly_as_it_is() -> None:
    held = {0: sized(a=5, b=1), 1: sized(c=3, d=3)}
    out = BalancedAssignment[S](weigh=lambda s: s.size).redistribute(held, [0, 1])
    assert by_id(out) == {0: ["a", "b"], 1: ["c", "d"]}


def test_redistribute_on_scale_up_moves_only_the_excess_to_the_new_reader() -> None:
    held = {0: named("a", "b", "c"), 1: named("d", "e", "f")}
    out = BalancedAssignment[S]().redistribute(held, [0, 1, 2])
    assert by_id(out) == {0: ["a", "b"], 1: ["d", "e"], 2: ["c", "f"]}
    assert _moves(held, out) == 2


def test_redistribute_on_scale_down_moves_only_the_removed_readers_splits() -> None:
    held = {0: named("a", "b"), 1: named("c", "d"), 2: named("e", "f")}
    out = BalancedAssignment[S]().redistribute(held, [0, 1])
    assert by_id(out) == {0: ["a", "b", "e"], 1: ["c", "d", "f"]}
    assert _moves(held, out) == 2


def test_redistribute_moves_as_few_as_needed_from_an_overloaded_reader() -> None:
    held = {0: named("a", "b", "c", "d"), 1: []}
    out = BalancedAssignment[S]().redistribute(held, [0, 1])
    assert by_id(out) == {0: ["a", "b"], 1: ["c", "d"]}


def test_redistribute_deals_unowned_splits_to_the_least_loaded() -> None:
    held = {0: named("a", "b"), 1: named("c")}
    out = BalancedAssignment[S]().redistribute(held, [0, 1], unowned=named("z"))
    assert by_id(out) == {0: ["a", "b"], 1: ["c", "z"]}


def test_redistribute_to_no_readers_assigns_nothing() -> None:
    assert BalancedAssignment[S]().redistribute({0: named("a")}, []) == {}


@pytest.mark.parametrize(
    ("held", "readers", "fewest_moves"),
    [
        # scale down 3 -> 2: only "c" must move; reader 0 may keep both of its splits
        ({0: named("a", "b"), 2: named("c")}, [0, 1], 1),
        # scale up 2 -> 4 (average < 1): only one of a/b must move; c can stay on reader 1
        ({0: named("a", "b"), 1: named("c")}, [0, 1, 2, 3], 1),
    ],
    ids=["scale-down", "average-below-one"],
)
def test_redistribute_moves_no_more_splits_than_balance_requires(
    held: dict[int, list[S]], readers: list[int], fewest_moves: int
) -> None:
    out = BalancedAssignment[S]().redistribute(held, readers)
    counts = [len(out.get(r, [])) for r in readers]
    assert max(counts) - min(counts) <= 1
    assert _moves(held, out) == fewest_moves


def _random_case(
    rng: random.Random, weighted: bool
) -> tuple[dict[int, list[S]], list[int], list[S]]:
    old, new = rng.randint(1, 6), rng.randint(1, 6)
    held: dict[int, list[S]] = {}
    unowned: list[S] = []
    for i in range(rng.randint(0, 20)):
        split = S(f"s{i:02d}", float(rng.randint(1, 9)) if weighted else 1.0)
        holder = rng.randint(-1, old - 1)
        (unowned if holder < 0 else held.setdefault(holder, [])).append(split)
    return held, list(range(new)), unowned


@pytest.mark.parametrize("weighted", [False, True], ids=["count", "weight"])
def test_redistribute_owns_every_split_once_and_bounds_max_minus_min(weighted: bool) -> None:
    rng = random.Random(537)
    strategy = BalancedAssignment[S](weigh=(lambda s: s.size) if weighted else None)
    for _ in range(300):
        held, readers, unowned = _random_case(rng, weighted)
        everything = sorted(
            s.split_id for s in [*unowned, *(s for ss in held.values() for s in ss)]
        )

        out = strategy.redistribute(held, readers, unowned)

        assert sorted(s.split_id for ss in out.values() for s in ss) == everything
        assert set(out) <= set(readers)
        if everything:
            loads = [sum(strategy.weight(s) for s in out.get(r, [])) for r in readers]
            heaviest = max(s.size for ss in [unowned, *held.values()] for s in ss)
            assert max(loads) - min(loads) <= (heaviest if weighted else 1) + 1e-9, (held, out)


@pytest.mark.parametrize("weighted", [False, True], ids=["count", "weight"])
def test_redistribute_never_moves_splits_of_a_reader_at_or_below_the_average(
    weighted: bool,
) -> None:
    rng = random.Random(27)
    strategy = BalancedAssignment[S](weigh=(lambda s: s.size) if weighted else None)
    for _ in range(300):
        held, readers, unowned = _random_case(rng, weighted)
        total = sum(s.size if weighted else 1 for ss in [unowned, *held.values()] for s in ss)
        average = total / len(readers)

        out = strategy.redistribute(held, readers, unowned)

        for reader in readers:
            mine = held.get(reader, [])
            if sum(s.size if weighted else 1 for s in mine) <= average:
                kept = {s.split_id for s in out.get(reader, [])}
                assert {s.split_id for s in mine} <= kept, (reader, held, out)


@pytest.mark.parametrize("weighted", [False, True], ids=["count", "weight"])
def test_assign_from_equal_loads_bounds_max_minus_min(weighted: bool) -> None:
    rng = random.Random(7)
    strategy = BalancedAssignment[S](weigh=(lambda s: s.size) if weighted else None)
    for _ in range(200):
        splits = [
            S(f"s{i}", float(rng.randint(1, 9)) if weighted else 1.0)
            for i in range(rng.randint(1, 20))
        ]
        readers = rng.randint(1, 6)
        out = strategy.assign(splits, dict.fromkeys(range(readers), 0.0))
        loads = [sum(strategy.weight(s) for s in out.get(r, [])) for r in range(readers)]
        assert max(loads) - min(loads) <= max(strategy.weight(s) for s in splits) + 1e-9
