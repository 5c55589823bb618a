"""wds.tar_files / tar_samples / samples / index_tar (our own walk over tar headers) against tarfile and
webdataset, on tars that are not the plain ones the mirror writes: long names (GNU, pax, ustar prefix),
folders, links, empty members, meta members, members bigger than a read range, no end blocks, a compressed
tar; and broken ones: cut short, a bad header, not a tar, empty. No Ray."""

from __future__ import annotations

import gzip
import io
import tarfile
from contextlib import contextmanager

import pytest

from mieb_ray import storage
from mieb_ray.errors import FormatError, UserError
from mieb_ray.io import tar as wds

LONG = "folder-" + "x" * 120 + "/s0000002.jpg"  # more than 100 characters: a GNU or pax long name


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE,
         link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mtime, info.linkname = kind, 1_700_000_000, link
    if data is not None:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _members(tar: tarfile.TarFile) -> None:
    _add(tar, "s0000000.jpg", b"\xff\xd8 first image")
    _add(tar, "s0000000.cls", b"3\n")
    _add(tar, "__meta__", b"skipped by webdataset")
    _add(tar, "a-folder", kind=tarfile.DIRTYPE)
    _add(tar, "s0000001.JPG", b"upper-case extension " * 40)
    _add(tar, "s0000001.cls", b"")  # an empty member
    _add(tar, "s0000001.link", kind=tarfile.SYMTYPE, link="s0000000.jpg")
    _add(tar, LONG, b"a long name")
    _add(tar, LONG[:-3] + "cls", b"7")
    _add(tar, "noext", b"a member without an extension")
    _add(tar, "sub/dir/s0000003.tar.gz", b"two extensions")
    _add(tar, "sub/dir/s0000003.cls", b"1")
    _add(tar, "s0000004.png", bytes(range(256)) * 300)  # 75 KiB: bigger than the small read ranges below
    _add(tar, "s0000004.cls", b"0")
    _add(tar, "s0000005.jpg", b"\x00" * 512)  # data that is a whole zero block


def _tar(path, fmt=tarfile.GNU_FORMAT, members=_members) -> str:
    with tarfile.open(path, "w", format=fmt) as tar:
        members(tar)
    return str(path)


def _webdataset(path: str) -> list[dict]:
    """What the build read before io/tar.py had its own tar walk: webdataset over tarfile."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    with open(path, "rb") as f:
        return list(group_by_keys({**m, "__url__": path} for m in tar_file_iterator(f)))


def _tarfile_files(path: str) -> list[tuple[int, str, bytes]]:
    with tarfile.open(path, "r|*") as tar:
        return [(m.offset, m.name, tar.extractfile(m).read()) for m in tar if m.isreg()]


def _our_files(path: str, read_bytes: int = wds.READ_BYTES, start: int = 0) -> list[tuple[int, str, bytes]]:
    with storage.open_input(path) as f:
        return [(at, name, bytes(data)) for batch in wds.tar_files(f, start, read_bytes)
                for at, name, data in batch]


@contextmanager
def no_tarfile():
    """tar_files walks these tars itself, handing nothing to tarfile (whose reader it falls back on otherwise)."""
    def fail(*args, **kwargs):
        raise AssertionError("handed to tarfile")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tarfile, "open", fail)
        yield


FORMATS = {"gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT, "ustar": tarfile.USTAR_FORMAT}


def _ustar_members(tar: tarfile.TarFile) -> None:
    """ustar has no long names: a long path is split at a slash into its prefix field (155) and name (100)."""
    for name, data in [("s0000000.jpg", b"a"), ("a-folder/" * 15 + "s0000001.jpg", b"prefixed name"),
                       ("s0000001.cls", b""), ("__meta__", b"x"), ("s0000002.png", b"\x01" * 70_000)]:
        _add(tar, name, data)
    _add(tar, "folder", kind=tarfile.DIRTYPE)
    _add(tar, "s0000002.lnk", kind=tarfile.LNKTYPE, link="s0000002.png")


def _more_members(tar: tarfile.TarFile) -> None:
    _members(tar)
    _add(tar, "Ünïcödé/s0000006.jpg", "a non-ASCII name".encode())  # pax: a path header; gnu: as UTF-8
    _add(tar, "s0000007.jpg", b"a long link name", link="l" * 120)  # gnu: a long link header before it
    _add(tar, "s0000007-" + "y" * 100 + ".cls", b"2", link="l" * 120)  # gnu: long link, then long name
    _add(tar, "s0000008.jpg", b"after the long ones")


def _webdataset_tar(path, members: int = 6) -> str:
    """As webdataset's TarWriter writes by default (mtime now, a float): a pax header before every member."""
    import webdataset as wds

    with wds.TarWriter(str(path), encoder=False) as sink:
        for i in range(members):
            sink.write({"__key__": f"s{i:07d}" if i != 3 else "k" * 150, "jpg": bytes([i]) * (100 * i),
                        "cls": str(i).encode()})
    return str(path)


@pytest.mark.parametrize("fmt", [*FORMATS, "webdataset"])
@pytest.mark.parametrize("read_bytes", [512, 1536, 4096, 70_000, wds.READ_BYTES])
def test_members_and_samples_equal_tarfile_and_webdataset(tmp_path, monkeypatch, fmt, read_bytes):
    if fmt == "webdataset":
        path = _webdataset_tar(tmp_path / "a.tar")
        assert open(path, "rb").read()[156:157] == tarfile.XHDTYPE
        expected = _tarfile_files(path)
        with no_tarfile():
            assert _our_files(path, read_bytes) == expected
    else:
        path = _tar(tmp_path / "a.tar", FORMATS[fmt], _ustar_members if fmt == "ustar" else _more_members)
    assert _our_files(path, read_bytes) == _tarfile_files(path)
    monkeypatch.setattr(wds, "READ_BYTES", read_bytes)
    assert [{**s, "__url__": path} for s in wds.samples(path)] == _webdataset(path)


def _webdataset_from(path: str, offset: int) -> list[dict]:
    """What wds.samples(path, offset) returned before: webdataset over tarfile from the offset on."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    with open(path, "rb") as f:
        f.seek(offset)
        return list(group_by_keys({**m, "__url__": path} for m in tar_file_iterator(f)))


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_the_index_and_reads_from_its_offsets_agree_with_tarfile(tmp_path, fmt):
    path = _tar(tmp_path / "a.tar", FORMATS[fmt], _more_members)
    first: dict[str, int] = {}  # index_tar's samples: members grouped by sample_key, meta members included
    for at, name, _ in _tarfile_files(path):
        first.setdefault(wds.sample_key(name), at)
    with tarfile.open(path) as tar:  # a long name's offset is that of its GNU or pax header, as tarfile's
        assert [m.offset for m in tar if m.isreg()][7] == [at for at, _, _ in _tarfile_files(path)][7]
    for every in (1, 2, 3):
        assert wds.index_tar(path, every) == (len(first), list(first.values())[::every])
    for offset in first.values():
        assert list(wds.samples(path, offset)) == _webdataset_from(path, offset)


def test_a_pax_global_header_and_a_v7_folder_go_as_tarfile_says(tmp_path):
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tar:
        _add(tar, "s0000000.jpg", b"image")
        _add(tar, "old-folder/", kind=tarfile.AREGTYPE)  # V7: a regular file whose name ends in "/"
        _add(tar, "s0000000.cls", b"1")
    assert _our_files(str(path)) == _tarfile_files(str(path))
    assert [{**s, "__url__": str(path)} for s in wds.samples(str(path))] == _webdataset(str(path))


def _set_field(data: bytearray, header: int, start: int, value: bytes) -> None:
    """Overwrite a field of the header at byte `header` and fix its checksum, as a tar writer would have."""
    data[header + start:header + start + len(value)] = value
    block = data[header:header + 512]
    chksum = 256 + sum(block[:148]) + sum(block[156:])
    data[header + 148:header + 156] = b"%06o\0 " % chksum


def test_a_pax_size_overrides_the_size_field(tmp_path, monkeypatch):
    """The pax record `size` (there for members of 8 GiB and more) wins over the header's size field."""
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i, data in enumerate([b"x" * 700, b"y" * 30, b"z" * 1300]):
            info = tarfile.TarInfo(f"s{i:07d}.jpg")
            info.size, info.pax_headers = len(data), {"size": str(len(data)), "comment": "padding " * i}
            tar.addfile(info, io.BytesIO(data))
    data = bytearray(path.read_bytes())
    for at, _, _ in _tarfile_files(str(path)):  # the header after each pax header: size field 0
        pax_size = int(data[at + 124:at + 135], 8)
        _set_field(data, at + 512 + -(-pax_size // 512) * 512, 124, b"00000000000\0")
    path.write_bytes(bytes(data))
    expected = [(at, name, body) for at, name, body in _tarfile_files(str(path))]
    assert [len(body) for _, _, body in expected] == [700, 30, 1300]
    with no_tarfile():
        for read_bytes in (512, 2048, wds.READ_BYTES):
            assert _our_files(str(path), read_bytes) == expected


def test_a_tar_without_end_blocks_ends_at_the_end_of_the_file(tmp_path):
    path = _tar(tmp_path / "a.tar")
    data = open(path, "rb").read()
    end = max(at for at, _, _ in _tarfile_files(path))  # the last member's header, then its data and padding
    last = _tarfile_files(path)[-1][2]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:end + 512 + -(-len(last) // 512) * 512])
    assert _our_files(str(cut), 1024) == _tarfile_files(path)


def test_a_compressed_tar_is_read_through_tarfile(tmp_path):
    path = _tar(tmp_path / "a.tar")
    packed = tmp_path / "packed.tar"
    packed.write_bytes(gzip.compress(open(path, "rb").read()))
    assert _our_files(str(packed)) == _tarfile_files(path)
    assert [{**s, "__url__": path} for s in wds.samples(str(packed))] == _webdataset(path)


BROKEN = ["cut in the first header", "cut in a later header", "cut in a member's data",
          "cut in a member bigger than a range", "cut in a member's padding", "a bad checksum in a later header",
          "not a tar", "empty"]


def _broken(tmp_path):
    path = _tar(tmp_path / "a.tar")
    data = open(path, "rb").read()
    files = _tarfile_files(path)
    big = next(at for at, name, _ in files if name.endswith(".png"))
    bad_header = bytearray(data)
    bad_header[files[2][0] + 10] ^= 0x55  # a name byte of the third member: its checksum no longer holds
    return {
        "cut in the first header": data[:300],
        "cut in a later header": data[:files[3][0] + 100],
        "cut in a member's data": data[:files[1][0] + 512 + 5],
        "cut in a member bigger than a range": data[:big + 512 + 40_000],
        "cut in a member's padding": data[:files[0][0] + 512 + len(files[0][2]) + 3],
        "a bad checksum in a later header": bytes(bad_header),
        "not a tar": b"not a tar file " * 100,
        "empty": b"",
    }


@pytest.mark.parametrize("case", BROKEN)
@pytest.mark.parametrize("read_bytes", [1024, wds.READ_BYTES])
def test_a_broken_tar_is_a_one_line_error_naming_the_file(tmp_path, monkeypatch, case, read_bytes):
    cases = _broken(tmp_path)
    assert set(cases) == set(BROKEN)
    path = tmp_path / "broken.tar"
    path.write_bytes(cases[case])
    monkeypatch.setattr(wds, "READ_BYTES", read_bytes)
    for read in (lambda: list(wds.samples(str(path))), lambda: wds.index_tar(str(path), 10),
                 lambda: list(wds.tar_samples(str(path)))):
        with pytest.raises(UserError) as caught:
            read()
        message = str(caught.value)
        assert isinstance(caught.value, FormatError)
        assert "broken.tar" in message and "\n" not in message, message


def test_a_repeated_member_in_a_sample_is_an_error(tmp_path):
    def members(tar):
        _add(tar, "s0000000.jpg", b"a")
        _add(tar, "s0000000.JPG", b"b")  # the same extension once lower-cased
    path = _tar(tmp_path / "a.tar", members=members)
    with pytest.raises(FormatError, match="duplicate file name"):
        list(wds.samples(path))


def test_data_are_views_of_the_range_and_samples_copy_them(tmp_path):
    path = _tar(tmp_path / "a.tar")
    key, members = next(iter(wds.tar_samples(path)))
    assert key == "s0000000" and isinstance(members["jpg"], memoryview) and members["jpg"].readonly
    sample = next(iter(wds.samples(path)))
    assert all(isinstance(v, bytes) for k, v in sample.items() if not k.startswith("__"))
