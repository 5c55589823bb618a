"""WebDataset tars, read the one way every job reads them: members grouped into samples as webdataset groups
them, a fast walk over the headers, an index of where samples start, and the cheap looks at a tar (its first
sample, its last member). A file that is not a tar, or is cut short, is one line naming it (FormatError)."""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator

import numpy as np

from mieb_ray import storage
from mieb_ray.errors import FormatError, UserError, first_line

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
BLOCK = 512  # tar header and data alignment



def sample_key(name: str) -> str:
    """webdataset's grouping of members into samples: the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    return f"{folder}/{base.split('.', 1)[0]}" if folder else base.split(".", 1)[0]


def key_index(key: str) -> int | None:
    """The row index a sample key carries (clip_benchmark writes `s%07d % index`): its file name's digits."""
    digits = re.sub(r"\D", "", key.rsplit("/", 1)[-1])
    return int(digits) if digits else None


def _tar_error(uri: str, exc: BaseException) -> FormatError:
    return FormatError(f"unreadable tar file {storage.display(uri)}: {first_line(exc)}")


def samples(uri: str, offset: int = 0) -> Iterator[dict]:
    """The tar's samples in order, as webdataset groups them: {"__key__", "__url__", <ext>: bytes, ...}.
    `offset`: where a sample's first member header starts (a tar read from there is a tar)."""
    for key, members in tar_samples(uri, offset):
        yield {"__key__": key, "__url__": uri, **{ext: bytes(data) for ext, data in members.items()}}


def tar_samples(uri: str, offset: int = 0) -> Iterator[tuple[str, dict]]:
    """(key, {ext: data}) of the tar's samples in order, grouped as webdataset groups them (its `__key__` and
    lower-cased extensions, meta members `__*__` skipped, a repeated extension an error). `data` is a read-only
    memoryview (bytes-like) into the range read: copy it (bytes(data)) to keep it past the next sample or two."""
    try:
        with storage.open_input(uri) as f:
            yield from _group(tar_files(f, offset))
    except (tarfile.TarError, OSError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        raise _tar_error(uri, exc) from exc


def first_member(uri: str) -> str:
    """The name of the tar's first member: one header read."""
    try:
        with storage.open_input(uri) as f, tarfile.open(fileobj=f, mode="r|") as tar:
            member = tar.next()
    except (tarfile.TarError, OSError) as exc:
        raise _tar_error(uri, exc) from exc
    if member is None:
        raise FormatError(f"empty tar file {storage.display(uri)}")
    return member.name


def first_sample(uri: str, max_members: int = 64) -> dict[str, bytes]:
    """The tar's first sample, {"__key__": key, <ext>: bytes, ...}, read from the top without the rest."""
    sample: dict = {}
    try:
        with storage.open_input(uri) as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for n, member in enumerate(tar):
                if not member.isfile():
                    continue
                key = sample_key(member.name)
                if sample and key != sample["__key__"] or n >= max_members:
                    break
                sample["__key__"] = key
                sample[member.name[len(key) + 1:].lower()] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError) as exc:
        raise _tar_error(uri, exc) from exc
    if not sample:
        raise FormatError(f"empty tar file {storage.display(uri)}")
    return sample


def last_member(uri: str, max_tail: int = 64 << 20) -> str | None:
    """The name of the tar's last file member, from the end of the file: headers are 512-byte aligned and
    checksummed, so the last valid one in the tail is found without reading the tar from the top. Reads
    1 MB of tail, then 8x more up to max_tail; None when no header is there (a last member bigger than that)."""
    try:
        with storage.open_input(uri) as f:
            size, tail = f.size(), 1 << 20
            while True:
                start = max(size - tail, 0)
                start -= start % BLOCK
                f.seek(start)
                buf = f.read(size - start)
                for at in range(len(buf) - len(buf) % BLOCK - BLOCK, -1, -BLOCK):
                    block = buf[at:at + BLOCK]
                    if block[257:262] != b"ustar":
                        continue
                    try:
                        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
                    except tarfile.HeaderError:
                        continue
                    if info.isfile():
                        return info.name
                if start == 0 or tail >= max_tail:
                    return None
                tail *= 8
    except OSError as exc:
        raise _tar_error(uri, exc) from exc


def index_tar(uri: str, every: int) -> tuple[int, list[int]]:
    """(samples in the tar, byte offset of the first member of sample 0, every, 2*every, ...), so that a unit of
    the tar can start reading at its own offset instead of at the top."""
    count, offsets, last_key = 0, [], None
    try:
        with storage.open_input(uri) as f:
            for batch in tar_files(f):
                for offset, name, _ in batch:
                    key = sample_key(name)
                    if key != last_key:
                        if count % every == 0:
                            offsets.append(offset)
                        count, last_key = count + 1, key
    except (tarfile.TarError, OSError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        raise _tar_error(uri, exc) from exc
    return count, offsets


# ---------------------------------------------------------------------------------------------- tar members
#
# A tar is a run of 512-byte headers, each followed by its member's data padded to 512 bytes. tarfile makes a
# TarInfo object per member and reads each one's data with several small reads (about 30 µs a member);
# tar_files() reads the tar in large ranges and walks the headers of each range in one tight loop, handing
# out the members' data as memoryviews of the range (no copy) and checking the headers' checksums in bulk
# (numpy). It reads what tarfile reads, the same way: the ustar prefix joined to the name, V7 folders (a
# name ending in "/"), links, devices and folders without data, types it does not know skipped with their
# data, the archive ended by a zero block or by the end of the file on a header boundary. What it does not
# walk itself, it hands to tarfile from that header on: GNU long names and links, pax headers (long names,
# big sizes), sparse files; and a file whose first header is not a tar header (a compressed tar, not a tar),
# so that tarfile decompresses it or names what is wrong. Unlike tarfile it never stops early in silence: a
# bad header or a tar cut short after the first member is an error (tarfile.ReadError; callers name the file).

READ_BYTES = 16 << 20  # a tar is read in ranges of this size (more where one member is bigger)
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = frozenset(b"0\x007")  # tarfile's regular files (REGTYPE, AREGTYPE, CONTTYPE)
_NO_DATA = frozenset(b"123456")  # links, devices, folders, fifos: tarfile skips no data after their headers
_EXTENDED = frozenset(b"xXLK")  # pax headers, GNU long names and links: about the header after them
_LONGNAME, _LONGLINK = b"LK"
_TARFILE = frozenset(b"Sg")  # GNU sparse files, pax global headers: read by tarfile
_PAX_RECORD = re.compile(br"(\d+) ([^=]+)=")  # tarfile's: "<length> <keyword>=<value>\n"
_SKIP_META = re.compile(r"__[^/]*__($|/)")  # webdataset's meta members (tar_file_iterator's skip_meta)
_BASE_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext


def _nti(field: bytes) -> int:
    """A numeric header field: octal digits up to a NUL (tarfile.nti; base-256 and odd fields through it)."""
    if not field[0] & 0x80:
        try:
            return int(field.split(b"\0", 1)[0] or b"0", 8)
        except ValueError:
            pass
    return tarfile.nti(field)


def _name(head: bytes) -> str:
    """The member's name as tarfile reads it: the name field, after the ustar prefix field when there is one."""
    name = head[:100]
    end = name.find(b"\0")
    name = (name if end < 0 else name[:end]).decode(tarfile.ENCODING, "surrogateescape")
    if head[345]:
        return f"{tarfile.nts(head[345:500], tarfile.ENCODING, 'surrogateescape')}/{name}"
    return name


def _pax_text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode(tarfile.ENCODING, "surrogateescape")


def _pax(data: bytes) -> tuple[str | None, int | None] | None:
    """(path, size) of a pax extended header's records (None where it has none), as tarfile applies them to the
    member after it; the other records (mtime, uid, ...) change neither. None: one tarfile should read (another
    charset, GNU sparse files, a bad record)."""
    if b"hdrcharset=" in data or b"GNU.sparse" in data:
        return None
    path = size = None
    at = 0
    while True:
        match = _PAX_RECORD.match(data, at)
        if not match:
            return path, size
        length = int(match.group(1))
        if length == 0:
            return None
        keyword = match.group(2)
        if keyword == b"path":
            path = _pax_text(data[match.end(2) + 1:match.start(1) + length - 1]).rstrip("/")
        elif keyword == b"size":
            try:
                size = int(_pax_text(data[match.end(2) + 1:match.start(1) + length - 1]))
            except ValueError:
                size = 0
        at += length


def _v7_folder(head: bytes) -> bool:
    """An old (V7) tar's folder: a regular file (AREGTYPE) whose name field ends in "/"."""
    name = head[:100]
    end = name.find(b"\0")
    return (name if end < 0 else name[:end]).endswith(b"/")


def _valid(head: bytes) -> bool:
    """tarfile's own check of one header block: its checksum field holds its checksum (unsigned or signed)."""
    try:
        return tarfile.nti(head[148:156]) in tarfile.calc_chksums(head)
    except tarfile.HeaderError:
        return False


def _check_sums(buf: bytes, heads: list[int], base: int) -> None:
    """The checksums of the headers at `heads` (offsets in buf, multiples of 512) in bulk: the sum of the header's
    bytes with the checksum field as 8 spaces, against the octal number in that field."""
    if not heads:
        return
    blocks = np.frombuffer(buf, np.uint8, count=len(buf) // BLOCK * BLOCK).reshape(-1, BLOCK)
    sel = blocks[np.asarray(heads, np.int64) // BLOCK]
    got = sel.sum(axis=1, dtype=np.int64) - sel[:, 148:156].sum(axis=1, dtype=np.int64) + 256
    field = sel[:, 148:156].astype(np.int64)
    before_nul = np.cumsum(field == 0, axis=1) == 0
    digit = (field >= 48) & (field <= 55) & before_nul
    stored = np.zeros(len(heads), np.int64)
    for j in range(8):
        stored = np.where(digit[:, j], stored * 8 + field[:, j] - 48, stored)
    # a field of digits, then NUL or spaces (what tar writers write), read as above; anything else by tarfile
    plain = ~(before_nul & ~digit & (field != 32)).any(axis=1)
    for i in np.flatnonzero(~plain | (stored != got)):
        at = heads[int(i)]
        if not _valid(buf[at:at + BLOCK]):
            raise tarfile.ReadError(f"bad checksum in the member header at byte {base + at}")


def _tarfile_files(f, at: int, mode: str = "r|") -> Iterator[list[tuple[int, str, bytes]]]:
    """The regular files from the header at byte `at` on, read by tarfile (what tar_files does not walk)."""
    f.seek(at)
    with tarfile.open(fileobj=f, mode=mode) as tar:
        for member in tar:
            if member.isreg():
                yield [(at + member.offset, member.name, tar.extractfile(member).read())]


def _read_at_least(f, n: int, size: int) -> bytes:
    """`size` bytes, or `n` at least, fewer only at the end of the file (a remote file may return short reads)."""
    data = f.read(max(n, size))
    while len(data) < n:
        more = f.read(n - len(data))
        if not more:
            break
        data += more
    return data


def tar_files(f, start: int = 0, read_bytes: int | None = None) -> Iterator[list[tuple[int, str, object]]]:
    """The regular files of the tar open in `f` (seekable), from the member header at byte `start` to the end of
    the archive, in batches: [(byte offset of the member's header, name, data)]. `data` is a read-only
    memoryview into the range read (bytes where tarfile read it); a batch holds the members of one range of
    `read_bytes` (default READ_BYTES).
    Raises tarfile.ReadError (or ValueError) for a tar that is cut short or whose headers are not tar headers."""
    read_bytes = read_bytes or READ_BYTES
    f.seek(start)
    buf = _read_at_least(f, BLOCK, read_bytes)
    if len(buf) < BLOCK or not _valid(buf[:BLOCK]):  # not a tar header: tarfile says what it is (or unpacks it)
        yield from _tarfile_files(f, start, "r|*")
        return
    base, pos = start, 0  # base: the file offset of buf[0]; pos: the next header's offset in buf
    regular, no_data, extended, to_tarfile, zero = _REGULAR, _NO_DATA, _EXTENDED, _TARFILE, _ZERO_BLOCK
    encoding = tarfile.ENCODING
    while True:
        view, n, batch, heads, need, done, handover = memoryview(buf), len(buf), [], [], BLOCK, False, False
        append, add_head = batch.append, heads.append
        while n - pos >= BLOCK:
            head = buf[pos:pos + BLOCK]
            if head == zero:
                done = True
                break
            kind, at, name, size = head[156], pos, None, None
            if kind in extended:  # a pax header or a GNU long name or link: applies to the header after it
                ext_size = _nti(head[124:136])
                nxt = pos + BLOCK + ext_size + (-ext_size % BLOCK)
                if nxt + BLOCK > n:
                    if not _valid(head):
                        raise tarfile.ReadError(f"bad checksum in the member header at byte {base + pos}")
                    need = nxt + BLOCK - pos
                    break
                ext = buf[pos + BLOCK:pos + BLOCK + ext_size]
                if kind == _LONGNAME:
                    end = ext.find(b"\0")
                    name = (ext if end < 0 else ext[:end]).decode(tarfile.ENCODING, "surrogateescape")
                elif kind != _LONGLINK:
                    fields = _pax(ext)
                    if fields is None:
                        handover = True
                        break
                    name, size = fields
                add_head(pos)
                pos = nxt
                head = buf[pos:pos + BLOCK]
                kind = head[156]
                if kind in extended or kind in to_tarfile or head == zero:  # a chain: tarfile reads it
                    heads.pop()
                    pos, handover = at, True
                    break
            elif kind in to_tarfile:
                handover = True
                break
            if kind in no_data or (kind == 0 and _v7_folder(head)):
                add_head(pos)
                pos += BLOCK
                continue
            if size is None:
                field = head[124:136]
                try:
                    size = int(field.split(b"\0", 1)[0] or b"0", 8) if field[0] < 0x80 else _nti(field)
                except ValueError:
                    size = _nti(field)
            stop = pos + BLOCK + size
            if stop > n:  # the member runs past the range: read on from its (first) header
                if not _valid(head):  # before trusting its size
                    raise tarfile.ReadError(f"bad checksum in the member header at byte {base + pos}")
                if at != pos:
                    heads.pop()
                need, pos = stop - at, at
                break
            add_head(pos)
            if kind in regular:
                if name is None:
                    if head[345]:
                        name = _name(head)
                    else:
                        end = head.find(b"\0", 0, 100)
                        name = head[:100 if end < 0 else end].decode(encoding, "surrogateescape")
                append((base + at, name, view[pos + BLOCK:stop]))
            pos = stop + (-size % BLOCK)
        _check_sums(buf, heads, base)
        if batch:
            yield batch
        del view, batch
        if done:
            return
        if handover:  # a header tarfile reads
            yield from _tarfile_files(f, base + pos)
            return
        if pos > n:  # the last member's padding runs past the range
            skip = pos - n
            if len(f.read(skip)) < skip:
                raise tarfile.ReadError("unexpected end of data")
            rest = b""
        else:
            rest = buf[pos:]
        base, pos = base + pos, 0
        more = _read_at_least(f, need - len(rest), read_bytes)
        if not more:
            if rest:
                raise tarfile.ReadError(f"unexpected end of data: the tar is cut short at byte {base + len(rest)}")
            return  # no end-of-archive blocks: the end of the file on a header boundary ends it (as tarfile)
        buf = rest + more if rest else more


def _group(batches) -> Iterator[tuple[str, dict]]:
    """Members grouped into samples as webdataset groups them: (key, {ext: data}) of consecutive members."""
    key, members = None, None
    for batch in batches:
        for _, name, data in batch:
            if "/" not in name:  # the common case, without the regular expressions
                if name.startswith("__") and name.endswith("__"):
                    continue
                dot = name.find(".")
                if dot <= 0:
                    continue
                prefix, ext = name[:dot], name[dot + 1:]
            else:
                match = None if _SKIP_META.match(name) else _BASE_EXT.match(name)
                if match is None:
                    continue
                prefix, ext = match.groups()
            ext = ext.lower()
            if prefix != key:
                if members is not None:
                    yield key, members
                key, members = prefix, {}
            elif ext in members:
                raise ValueError(f"{name}: duplicate file name in tar file {ext} {list(members)}")
            members[ext] = data
    if members is not None:
        yield key, members
