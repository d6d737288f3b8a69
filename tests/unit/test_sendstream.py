"""The send-stream parser and change tracker on a stream captured from a real
``btrfs send --no-data -p Q P`` (kernel 6.x, btrfs-progs 6.2), and on streams encoded here.

The captured scenario, in W between Q and P: ``mv a z`` (z holds ``b/f`` and ``k``),
append to ``top``, ``chmod 700 z/k``, replace symlink ``link`` (a/b/f -> top), ``mkdir new``
with ``new/n``, ``rmdir empty``.
"""

from __future__ import annotations

import base64
import struct

import pytest

from cairn.settle.changes import (
    COMMANDS,
    MAGIC,
    PATH_ATTRS,
    ChangeTracker,
    StreamError,
    crc32c,
    parse,
    parse_paths,
)

CAPTURED = base64.b64decode(
    "YnRyZnMtc3RyZWFtAAEAAABFAAAAAgCHu9uGDwABAFABABAAH5tICFno0UKN9pRGNDoskwIACAAIAAAAAAAAABQA"
    "EABOgDeCDQ6mSb0kpX/uGXl9FQAIAAcAAAAAAAAACgAAAAkA7bbZig8AAQBhEAABAHoJAAAADABpI68PDwAFAGVt"
    "cHR5HwAAABYAFfCesg8AAwB0b3ASAAgAAAAAAAAAAAAEAAgABQAAAAAAAAA3AAAAFAAY6DOfDwADAHRvcAsADACU"
    "FRBrAAAAAA/UNzMKAAwAlBUQawAAAACSLGIzCQAMAJQVEGsAAAAAkixiMwgAAAALADPe6OAPAAQAbGluaxMAAAAS"
    "AH72Z7UPAAMAei9rBQAIAMABAAAAAAAANwAAABQAP2GPDQ8AAwB6L2sLAAwAlBUQawAAAADuFDkzCgAMAJQVEGsA"
    "AAAA5sE7MwkADACUFRBrAAAAAJIsYjMfAAAACAC2olgmDwAIAG8yNjQtOC0wAwAIAAgBAAAAAAAAEQADAHRvcBQA"
    "AAAJANKdclcPAAgAbzI2NC04LTAQAAQAbGluayAAAAATAJ3wOVsPAAQAbGluawYACAAAAAAAAAAAAAcACAAAAAAA"
    "AAAAADgAAAAUAHuXZf0PAAQAbGluawsADACUFRBrAAAAAJIsYjMKAAwAlBUQawAAAACSLGIzCQAMAJQVEGsAAAAA"
    "kixiMxgAAAAEAKfltYYPAAgAbzI2NS04LTADAAgACQEAAAAAAAATAAAACQC6ne/qDwAIAG8yNjUtOC0wEAADAG5l"
    "dx8AAAATAERKC6wPAAMAbmV3BgAIAAAAAAAAAAAABwAIAAAAAAAAAAAAEwAAABIAQTutYA8AAwBuZXcFAAgA7QEA"
    "AAAAAAAYAAAAAwAQwfzVDwAIAG8yNjYtOC0wAwAIAAoBAAAAAAAAFQAAAAkA6dLA5g8ACABvMjY2LTgtMBAABQBu"
    "ZXcvbiEAAAAWAOwBIeEPAAUAbmV3L24SAAgAAAAAAAAAAAAEAAgAAQAAAAAAAAAhAAAAEwC858U/DwAFAG5ldy9u"
    "BgAIAAAAAAAAAAAABwAIAAAAAAAAAAAAFQAAABIA/35ICA8ABQBuZXcvbgUACACkAQAAAAAAADkAAAAUAD99ZGUP"
    "AAUAbmV3L24LAAwAlBUQawAAAACSLGIzCgAMAJQVEGsAAAAAn15kMwkADACUFRBrAAAAAJ9eZDM3AAAAFAC6SJ6E"
    "DwADAG5ldwsADACUFRBrAAAAAJIsYjMKAAwAlBUQawAAAACSLGIzCQAMAJQVEGsAAAAAkixiMzQAAAAUANer4ckP"
    "AAAACwAMAJQVEGsAAAAAbxIvMwoADACUFRBrAAAAAJ9eZDMJAAwAlBUQawAAAACfXmQzNQAAABQAaps/6A8AAQB6"
    "CwAMAJQVEGsAAAAAbxIvMwoADACUFRBrAAAAAO4UOTMJAAwAlBUQawAAAADmwTszAAAAABUAUGzJnQ==")


def encode(commands: list[tuple[int, list[tuple[int, bytes]]]], version: int = 1) -> bytes:
    """A send stream with correct CRCs: ``(command number, [(attribute number, value)])``."""
    out = bytearray(MAGIC + struct.pack("<I", version))
    for cmd, attrs in commands:
        payload = b"".join(struct.pack("<HH", a, len(v)) + v for a, v in attrs)
        header = struct.pack("<IHI", len(payload), cmd, 0)
        crc = crc32c(header + payload)
        out += struct.pack("<IHI", len(payload), cmd, crc) + payload
    return bytes(out)


SNAPSHOT, MKFILE, MKDIR, RENAME, LINK, UNLINK, RMDIR, CHMOD, END, UPDATE_EXTENT = (
    2, 3, 4, 9, 10, 11, 12, 18, 21, 22,
)
PATH, PATH_TO, PATH_LINK, MODE = 15, 16, 17, 5


def p(path: str) -> tuple[int, bytes]:
    return (PATH, path.encode())


def to(path: str) -> tuple[int, bytes]:
    return (PATH_TO, path.encode())


def tracked(stream: bytes):  # type: ignore[no-untyped-def]
    t = ChangeTracker()
    t.feed(parse(stream, verify_crc=True))
    return t.result()


def test_captured_stream_parses_with_valid_crcs() -> None:
    names = [c.name for c in parse(CAPTURED, verify_crc=True)]
    assert names[0] == "SNAPSHOT" and names[-1] == "END"
    assert names.count("RENAME") == 4
    assert {"RMDIR", "UNLINK", "SYMLINK", "MKDIR", "MKFILE", "CHMOD", "UPDATE_EXTENT"} <= set(names)
    chmods = [c for c in parse(CAPTURED) if c.name == "CHMOD"]
    assert (chmods[0].path(), chmods[0].ints["mode"]) == ("z/k", 0o700)


def test_captured_stream_changes_follow_temporary_names_and_renames() -> None:
    cs = tracked(CAPTURED)
    # Without a tree reader the moved directory's untouched children are not listed.
    assert cs.created == ["new", "new/n", "z", "z/k"]
    assert cs.deleted == ["a", "a/k", "empty"]
    assert cs.modified == ["link", "top"]
    assert [(r.old, r.new) for r in cs.renamed] == [("a", "z")]
    assert not any(path.startswith("o2") for path in cs.paths())


def test_flipped_byte_is_a_crc_mismatch() -> None:
    bad = bytearray(CAPTURED)
    bad[60] ^= 0x01
    with pytest.raises(StreamError, match="CRC"):
        list(parse(bytes(bad), verify_crc=True))


def test_truncated_stream_is_refused() -> None:
    with pytest.raises(StreamError, match="truncated"):
        list(parse(CAPTURED[:-3]))
    with pytest.raises(StreamError):
        list(parse(b"not a stream at all"))


def test_orphanized_inode_parked_and_renamed_back() -> None:
    # The kernel parks existing "a" under a temporary name, then puts a new file at "a"
    # and moves the old inode to "b".
    stream = encode([
        (SNAPSHOT, [p("P")]),
        (RENAME, [p("a"), to("o257-5-0")]),
        (MKFILE, [p("o300-9-0")]),
        (RENAME, [p("o300-9-0"), to("a")]),
        (UPDATE_EXTENT, [p("a")]),
        (RENAME, [p("o257-5-0"), to("b")]),
        (END, []),
    ])
    cs = tracked(stream)
    assert cs.modified == ["a"]
    assert cs.created == ["b"]
    assert cs.deleted == []
    assert [(r.old, r.new) for r in cs.renamed] == [("a", "b")]


def test_paths_under_a_renamed_directory_and_chmod_inside() -> None:
    stream = encode([
        (SNAPSHOT, [p("P")]),
        (RENAME, [p("d"), to("e")]),
        (CHMOD, [p("e/x"), (MODE, struct.pack("<Q", 0o600))]),
        (UNLINK, [p("e/y")]),
        (LINK, [p("e/z"), (PATH_LINK, b"e/x")]),
        (END, []),
    ])
    cs = tracked(stream)
    assert cs.deleted == ["d", "d/x", "d/y"]
    assert cs.created == ["e", "e/x", "e/z"]
    assert cs.metadata == []


def test_chmod_in_place_is_metadata_and_rmdir_is_deleted() -> None:
    stream = encode([
        (SNAPSHOT, [p("P")]),
        (CHMOD, [p("src/run.sh"), (MODE, struct.pack("<Q", 0o755))]),
        (UNLINK, [p("old/f")]),
        (RMDIR, [p("old")]),
        (MKDIR, [p("o260-3-0")]),
        (RENAME, [p("o260-3-0"), to("src/new")]),
        (END, []),
    ])
    cs = tracked(stream)
    assert cs.metadata == ["src/run.sh"]
    assert cs.deleted == ["old", "old/f"]
    assert cs.created == ["src/new"]


def test_subpath_filters_and_strips() -> None:
    stream = encode([
        (SNAPSHOT, [p("P")]),
        (UPDATE_EXTENT, [p("proj/a")]),
        (UPDATE_EXTENT, [p("other/b")]),
        (RENAME, [p("other/c"), to("proj/c")]),
        (RENAME, [p("proj/d"), to("other/d")]),
        (END, []),
    ])
    t = ChangeTracker()
    t.feed(parse(stream))
    cs = t.result(subpath="proj")
    assert cs.modified == ["a"]
    assert cs.created == ["c"]
    assert cs.deleted == ["d"]
    assert cs.renamed == []


def test_stream_naming_a_deleted_path_is_refused() -> None:
    stream = encode([
        (SNAPSHOT, [p("P")]),
        (UNLINK, [p("a")]),
        (UPDATE_EXTENT, [p("a")]),
        (END, []),
    ])
    with pytest.raises(StreamError, match="gone"):
        tracked(stream)


def test_version_2_data_attribute_runs_to_end_of_command() -> None:
    payload = struct.pack("<HH", PATH, 1) + b"f" + struct.pack("<H", 19) + b"\x00\x01\x02\x03"
    header = struct.pack("<IHI", len(payload), 15, 0)
    stream = MAGIC + struct.pack("<I", 2) + struct.pack(
        "<IHI", len(payload), 15, crc32c(header + payload)
    ) + payload
    (cmd,) = list(parse(stream, verify_crc=True))
    assert cmd.name == "WRITE"
    assert cmd.raw["data"] == b"\x00\x01\x02\x03"


UTIMES = 20
COMMAND_NUMBERS = {v: k for k, v in COMMANDS.items()}


def test_path_only_decoding_keeps_paths_and_drops_the_rest() -> None:
    full = list(parse(CAPTURED, verify_crc=True))
    lean = list(parse(CAPTURED, verify_crc=True, attrs=PATH_ATTRS))
    assert [c.name for c in lean] == [c.name for c in full]
    assert all(not c.ints and set(c.raw) <= {"path", "path_to", "path_link"} for c in lean)
    assert [c.raw for c in lean] == [
        {k: v for k, v in c.raw.items() if k in ("path", "path_to", "path_link")} for c in full
    ]
    t = ChangeTracker()
    t.feed(iter(lean))
    assert t.result() == tracked(CAPTURED)


def one_command(cmd: int, payload: bytes) -> bytes:
    header = struct.pack("<IHI", len(payload), cmd, 0)
    return MAGIC + struct.pack("<I", 1) + struct.pack(
        "<IHI", len(payload), cmd, crc32c(header + payload)
    ) + payload


def test_path_only_decoding_still_refuses_a_skipped_attribute_past_its_command() -> None:
    # MODE claims 200 bytes in a command of a few: skipping it must not read past the
    # command into the next one.
    path = struct.pack("<HH", PATH, 1) + b"f"
    too_long = one_command(CHMOD, path + struct.pack("<HH", MODE, 200) + b"\0" * 8)
    with pytest.raises(StreamError, match="attribute is truncated"):
        list(parse(too_long, attrs=PATH_ATTRS))
    half_header = one_command(CHMOD, path + b"\x05")
    with pytest.raises(StreamError, match="attribute header is truncated"):
        list(parse(half_header, attrs=PATH_ATTRS))
    for bad in (too_long, half_header, CAPTURED[:-3], b"not a stream"):
        with pytest.raises(StreamError):
            list(parse(bad, attrs=PATH_ATTRS))
        with pytest.raises(StreamError):
            list(parse_paths(bad))


def test_the_lean_stream_replay_is_the_command_replay() -> None:
    lean = list(parse_paths(CAPTURED))
    full = list(parse(CAPTURED, verify_crc=True))
    assert [n for n, *_ in lean] == [COMMAND_NUMBERS[c.name] for c in full]
    assert [paths for _, *paths in lean] == [
        [c.path(k) if k in c.raw else None for k in ("path", "path_to", "path_link")]
        for c in full
    ]
    t = ChangeTracker()
    t.feed_stream(CAPTURED)
    assert t.result() == tracked(CAPTURED)
    lacking = encode([(SNAPSHOT, [p("P")]), (RENAME, [p("a")]), (END, [])])
    with pytest.raises(StreamError, match="lacks path_to"):
        ChangeTracker().feed_stream(lacking)
    with pytest.raises(StreamError, match="lacks path_to"):
        tracked(lacking)


def test_a_path_named_again_after_its_directory_moved_is_refused() -> None:
    # The replay remembers what each path named; a move must make it forget.
    stream = encode([
        (SNAPSHOT, [p("P")]),
        (UTIMES, [p("d/f")]),
        (RENAME, [p("d"), to("e")]),
        (UPDATE_EXTENT, [p("e/f")]),
        (UTIMES, [p("d/f")]),
        (END, []),
    ])
    with pytest.raises(StreamError, match="gone"):
        tracked(stream)


def test_a_path_reused_after_a_rename_names_the_new_entry() -> None:
    stream = encode([
        (SNAPSHOT, [p("P")]),
        (UTIMES, [p("a")]),
        (RENAME, [p("a"), to("b")]),
        (MKFILE, [p("a")]),
        (UPDATE_EXTENT, [p("a")]),
        (UTIMES, [p("a")]),
        (END, []),
    ])
    cs = tracked(stream)
    assert cs.created == ["b"]
    assert cs.modified == ["a"]
    # "b" because the first UTIMES named the entry that moved there; "a" only if the
    # last one named the new file rather than the moved entry.
    assert cs.touched == ["a", "b"]


def test_thousands_of_nested_directories_resolve_without_recursion() -> None:
    depth = 1500
    commands: list[tuple[int, list[tuple[int, bytes]]]] = [(SNAPSHOT, [p("P")])]
    commands += [(MKDIR, [p("/".join(["n"] * i))]) for i in range(1, depth + 1)]
    commands.append((END, []))
    cs = tracked(encode(commands))
    assert len(cs.created) == depth
    assert max(cs.created, key=len).count("/") == depth - 1
