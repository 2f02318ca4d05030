"""The declared wire (``tree.wire``): the one frame codec, the enums and the row layouts.

Both sides use these very functions (the helper's ``Channel``, the client, the upload
stream), so each rule here holds on both ends of the stream.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_keepalive_frames import frames

from filesync.core.exclude import ExcludeRule
from filesync.tree import wire
from filesync.tree.walk import walk
from filesync.tree.wire import (
    DIRECT,
    FLUSH_AT,
    HEADER,
    ROW_LEN,
    ROW_NLINK,
    ROW_PATH,
    ROW_SIZE,
    BadRequest,
    Gather,
    Op,
    Status,
    decode_json,
    encode_json,
    frame_head,
    json_codec,
    listing_payload,
    listing_row,
    ok_sent,
    result_row,
    skipped_row,
)


def test_gather_writes_about_flush_at_and_big_chunks_straight_through() -> None:
    gather, writes = Gather(), []
    small = b"x" * 1000
    for _ in range(FLUSH_AT // 1000 * 3):
        writes += gather.add(b"D", small)
    big = b"y" * DIRECT
    writes += gather.add(b"D", big)
    writes.append(gather.take())
    # Nothing is lost or reordered, small frames are gathered, the big chunk is its own
    # write (the very object: no copy), right after the frames before it.
    assert [p for _, p in frames(b"".join(writes))] == [small] * (FLUSH_AT // 1000 * 3) + [big]
    assert any(w is big for w in writes)
    assert all(len(w) < FLUSH_AT + 1000 + HEADER.size for w in writes if w is not big)
    assert len(writes) >= 3 and gather.take() == b""


def test_gather_whole_frame_holds_header_and_body() -> None:
    gather = Gather()
    for name, expect in (("d/a", None), ("b\udcff", (3, 7))):  # a name not UTF-8 survives
        head = wire.whole_head(name, 0o640, 1_234_567_890_123_456_789, expect)
        assert head is not None and gather.add_whole(head, b"body") == []
        ((kind, payload),) = frames(gather.take())
        rel, mode, mtime_ns, got, body = wire.split_whole(payload)
        assert kind == b"W" and (rel, mode, mtime_ns) == (name, 0o640, 1_234_567_890_123_456_789)
        assert got == (list(expect) if expect else None) and bytes(body) == b"body"


def test_a_header_the_binary_layout_cannot_hold_is_none() -> None:
    # Such a file goes as H/D/E, whose JSON header the helper checks (and refuses) as ever.
    assert wire.whole_head("a", 0o644, -1, None) is None
    assert wire.whole_head("a", -1, 1, None) is None
    assert wire.whole_head("a", 0o644, 1, (-1, 1)) is None
    assert wire.whole_head("a", 0o644, 2**64, None) is None
    assert wire.whole_head("\ud800", 0o644, 1, None) is None  # not bytes at all
    assert wire.whole_head("\udcc3\udca9", 0o644, 1, None) is None  # would read back as "é"


@pytest.mark.parametrize("payload", [
    b"\x00" * (wire.WHOLE_HEAD.size - 1),
    wire.WHOLE_HEAD.pack(2, 0o644, 1, 0, 0, 0) + b"a",
    wire.WHOLE_HEAD.pack(1, 0o644, 1, 2, 0, 0) + b"a",
], ids=["short", "path-past-frame", "expect-flag-not-0-or-1"])
def test_split_whole_refuses_a_malformed_header(payload: bytes) -> None:
    with pytest.raises(BadRequest):
        wire.split_whole(payload)


def test_frame_head_refuses_unknown_kinds_and_frames_over_the_cap() -> None:
    assert frame_head(HEADER.pack(b"Z", wire.MAX_FRAME)) == (b"Z", wire.MAX_FRAME)
    with pytest.raises(BadRequest, match="of 268435457 bytes"):
        frame_head(HEADER.pack(b"Z", wire.MAX_FRAME + 1))
    with pytest.raises(BadRequest):
        frame_head(HEADER.pack(b"Q", 1))
    with pytest.raises(BadRequest):  # a hello is a J frame, nothing else
        frame_head(HEADER.pack(b"Z", 1), b"J")


def test_decode_json_round_trips_and_refuses_non_objects_and_bombs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    obj = {"name": "caf\udce9", "n": [1, 2]}  # a name that is not UTF-8 survives
    assert decode_json(b"J", encode_json(obj)) == obj
    assert decode_json(b"Z", wire.json_payload(obj, b"Z")) == obj
    for kind, payload in [(b"J", b"[1]"), (b"J", b"{"), (b"Z", b"not zlib")]:
        with pytest.raises(BadRequest):
            decode_json(kind, payload)
    monkeypatch.setattr(wire, "MAX_JSON", 1000)
    # Inflated past the cap: refused (never held whole), even where the first MAX_JSON
    # bytes would parse on their own.
    with pytest.raises(BadRequest):
        decode_json(b"Z", zlib.compress(encode_json({"x": 1}) + b" " * 5000))
    assert decode_json(b"Z", zlib.compress(encode_json({"x": 1}) + b" " * 900)) == {"x": 1}


def test_enums_travel_as_their_values() -> None:
    assert json.loads(encode_json({"r": ["p", Status.OK, 1, 2], "op": Op.LIST})) == {
        "r": ["p", "ok", 1, 2], "op": "list"}
    assert {s.value for s in Status} == {"ok", "changed", "error"}


def test_every_row_the_walk_makes_has_the_listing_layout(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.txt").write_bytes(b"12345")
    (tmp_path / "g").write_bytes(b"")
    (tmp_path / "h").symlink_to("g")
    entries, skipped, _ = walk(str(tmp_path), ExcludeRule.build().matcher())
    rows = json.loads(json.dumps(entries))  # as they arrive
    assert rows and all(listing_row(row) for row in rows)
    assert len(rows[0]) == ROW_LEN
    by_path = {row[ROW_PATH]: row for row in rows}
    assert by_path["d/f.txt"][ROW_SIZE] == 5 and by_path["d/f.txt"][ROW_NLINK] == 1
    assert skipped and all(skipped_row(row) for row in json.loads(json.dumps(skipped)))


@pytest.mark.parametrize("row", [
    ["a", "f", 1, 2, 3, 4],  # short
    ["a", "f", 1, 2, 3, 4, 1, 0],  # long
    ["a", "f", True, 2, 3, 4, 1],  # a bool is not a count
    ["a", "f", 1, -2, 3, 4, 1],  # negative
    ["a", "f", 1, 2.0, 3, 4, 1],  # not an int
    [1, "f", 1, 2, 3, 4, 1],  # path not a string
    ("a", "f", 1, 2, 3, 4, 1),  # JSON gives lists
])  # fmt: skip
def test_listing_row_refuses_any_other_layout(row: object) -> None:
    assert listing_row(["a", "f", 1, 2, 3, 4, 1])
    assert not listing_row(row)


def test_result_rows() -> None:
    assert ok_sent(["a", "ok", 1, 2], "a")
    assert not ok_sent(["a", "ok", 1, 2], "b") and not ok_sent(["a", "ok", True, 2], "a")
    assert result_row(["a", "ok"]) == ("a", Status.OK, [])
    assert result_row(["a", "ok", 1, 2]) == ("a", Status.OK, [1, 2])
    assert result_row(["a", "changed", "changed", ""]) == ("a", Status.CHANGED,
                                                           ["changed", ""])
    assert result_row(["a", "error", "os-error", "x"])[1] is Status.ERROR  # type: ignore[index]
    for bad in (["a"], ["a", "ok", -1, 2], ["a", "done"], ["a", "error", "x"], [1, "ok"]):
        assert result_row(bad) is None, bad


def test_file_header_is_checked() -> None:
    assert wire.file_header({"path": "a", "mode": 0o644, "mtime_ns": 1, "expect": [1, 2]}) \
        == ("a", 0o644, 1, [1, 2])
    for bad in ({"path": "a", "mode": -1, "mtime_ns": 1},
                {"path": "a", "mode": 1, "mtime_ns": 1, "expect": [1]},
                {"mode": 1, "mtime_ns": 1}):
        with pytest.raises(BadRequest):
            wire.file_header(bad)
    assert wire.fetch_header({"size": 1, "mtime_ns": 2, "mode": 3}) == (1, 2, 3)
    assert wire.fetch_header({"size": 1, "mtime_ns": "2", "mode": 3}) is None


# -- the JSON codec: json's C code, run as json runs it ----------------------------------

json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats()
    | st.text(alphabet=st.characters(codec=None), max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)
#: Text that is JSON now and then, mostly not: the scanner's every branch and error.
json_like = st.text(alphabet=st.sampled_from(list('{}[]",:0123456789.eE-+ \t\n\rtrufalsenNIiy\\')),
                    max_size=16)


def same_json(got: object, want: object) -> bool:
    """Equal as JSON values (NaN, which equals nothing, included)."""
    return json.dumps(got) == json.dumps(want)


@settings(max_examples=300)
@given(obj=json_value)
def test_the_codec_writes_what_json_dumps_writes(obj: object) -> None:
    dumps = json_codec()[1]
    assert dumps(obj) == json.dumps(obj, separators=(",", ":"))


@settings(max_examples=500)
@given(text=json_like | json_value.map(json.dumps), pad=st.sampled_from(["", " ", "\n\t\r "]))
def test_the_codec_reads_what_json_loads_reads_and_refuses_what_it_refuses(
        text: str, pad: str) -> None:
    loads = json_codec()[0]
    text = pad + text + pad
    try:
        want = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            loads(text)
        return
    assert same_json(loads(text), want)


def test_the_codec_refuses_what_json_cannot_write_and_writes_on_after_it() -> None:
    dumps = json_codec()[1]
    shared = [1]
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        dumps({"a": shared, "b": {1}})
    # No circular-reference marker is left behind by the failed call.
    assert dumps({"a": shared}) == '{"a":[1]}'
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        dumps({"loop": loop})


def test_the_codec_is_jsons_where_its_c_part_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert json_codec()[0] is not json.loads  # CPython: the C part, without json's module
    monkeypatch.setitem(sys.modules, "_json", None)
    loads, dumps, quote = json_codec()
    assert loads is json.loads
    assert dumps({"a": [1, "b"]}) == '{"a":[1,"b"]}'
    assert quote("é\"") == '"\\u00e9\\""'
    assert json_codec(native=False)[0] is json.loads


# -- listing replies: rows written by a format string, bytes as the encoder's -----------

name_st = st.text(alphabet=st.characters(codec=None), max_size=6) | st.sampled_from(
    ['a"b', "back\\slash", "caf\udce9", "\x00\n", "entries", '"entries":[]'])
count_st = st.integers(min_value=0, max_value=2**64)
row_st = st.tuples(name_st, st.just("f"), count_st, count_st, count_st, count_st, count_st)


@settings(max_examples=300)
@given(rows=st.lists(row_st.map(list), max_size=5), root=name_st,
       delta=st.booleans(), as_tuples=st.booleans())
def test_a_listing_payload_is_the_encoders_byte_for_byte(
        rows: list[list[object]], root: str, delta: bool, as_tuples: bool) -> None:
    entries = [tuple(row) for row in rows] if as_tuples else rows  # a watched tree's rows
    reply: dict[str, object] = {"root": root, "exists": True, "is_dir": True,
                                "entries": entries, "skipped": [[root, "symlink", ""]],
                                "excluded": 3}
    if delta:
        reply.update(removed=[root, "x"], base=4)
    reply["gen"] = 5
    assert listing_payload(reply) == wire.json_payload(reply, b"Z")


def test_a_listing_payload_of_a_walk_and_of_no_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for name in ("a.txt", 'q"uote', "caf\u00e9", "d/b"):
        (tmp_path / name).write_text(name)
    entries, skipped, excluded = walk(str(tmp_path), ExcludeRule().matcher())
    reply = {"root": str(tmp_path), "exists": True, "is_dir": True, "entries": entries,
             "skipped": skipped, "excluded": excluded, "gen": 1}
    assert listing_payload(reply) == wire.json_payload(reply, b"Z")
    absent = {"root": "/nowhere", "exists": False, "is_dir": False, "gen": 1}
    assert listing_payload(absent) == wire.json_payload(absent, b"Z")
