"""Signed models: keys, signing, the trust decision, and tampering refused in every part of the file."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
import subprocess
import sys
import warnings

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from hypothesis import given, settings
from hypothesis import strategies as st

import omrt
from omrt import signing
from omrt.format import HEADER, Entry, OmFile, Part, write
from omrt.format.container import ENTRY, VERSION
from omrt.format.kernelstore import PYTHON_OP, unpack
from omrt.format.signature import Signature, file_message, message, signed_parts
from omrt.format.signature import read as read_signature
from omrt.native import build as native_build
from test_native import cnn_model, reference

SRC = os.path.dirname(os.path.dirname(omrt.__file__))
X = np.random.default_rng(5).standard_normal((1, 8, 12, 12)).astype(np.float32)
LATER = 99
"""A partition type this omrt does not know (a later release's): a signature must cover it too."""


@pytest.fixture(autouse=True)
def no_keys_file(monkeypatch):
    """In-process tests trust only the keys they pass, whatever the user's config holds."""
    monkeypatch.setenv("OMRT_TRUSTED_KEYS", "")


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("keys")
    return {name: (str(folder / name), signing.keygen(folder / name)) for name in ("alice", "mallory")}


def _copy_with(source: str, target: str, extra: dict[int, bytes]) -> None:
    """Rewrite `source` into `target` with `extra` partitions (type -> bytes) appended."""
    f = OmFile(source)
    try:
        parts = [(e.type, lambda sink, e=e: sink(f.map[e.offset:e.offset + e.size]))
                 for e in sorted(f.entries.values(), key=lambda e: e.offset)]
        write(target, parts + [(t, lambda sink, d=d: sink(d)) for t, d in extra.items()], flags=f.flags)
    finally:
        f.close()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> str:
    """The CNN of test_native, with its native library, and a partition of a type this omrt does not know."""
    if native_build.compiler() is None:
        pytest.skip("no C compiler on this host")
    folder = tmp_path_factory.mktemp("signing")
    plain = str(folder / "plain.om")
    omrt.compile(cnn_model(), plain)
    path = str(folder / "cnn.om")
    _copy_with(plain, path, {LATER: b"a later release's partition: it may decide what code runs"})
    return path


@pytest.fixture(scope="module")
def signed(compiled, keys, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("signed") / "cnn.om")
    with open(compiled, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    signing.sign(path, keys["alice"][0])
    return path


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _quiet_load(source, **kw) -> tuple[omrt.Model, list[str]]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        model = omrt.load(source, **kw)
    return model, [str(w.message) for w in got if issubclass(w.category, RuntimeWarning)]


def _runs_native(model: omrt.Model) -> bool:
    return model.native is not None and [k.status for k in model.kernels] == ["loaded"]


# --- keys ---------------------------------------------------------------------------------------

def test_keygen_writes_a_private_key_only_the_owner_reads_and_a_public_key_line(tmp_path):
    key = tmp_path / "build"
    fingerprint = signing.keygen(key, comment="build machine")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert (tmp_path / "build.pub").read_text() == f"{raw.hex()} build machine\n"
    assert fingerprint == hashlib.sha256(raw).hexdigest()
    assert [(k.raw, k.source) for k in signing.read_key_file(tmp_path / "build.pub")] == \
        [(raw, f"key file {tmp_path / 'build.pub'}: build machine")]
    with pytest.raises(omrt.InputError, match=r"build exists; omrt keygen never overwrites a key"):
        signing.keygen(key)
    assert serialization.load_pem_private_key(key.read_bytes(), password=None).private_bytes_raw() == \
        private.private_bytes_raw()


def test_trusted_keys_are_raw_bytes_hex_base64_or_key_files(tmp_path):
    private = ed25519.Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes_raw()
    pem = tmp_path / "key.pem"
    pem.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    lines = tmp_path / "keys"
    lines.write_text(f"# build hosts\n\n{base64.b64encode(raw).decode()}   ci runner 3\n")
    for value in (raw, bytearray(raw), raw.hex(), raw.hex().upper(), base64.b64encode(raw).decode(), str(pem), pem,
                  lines):
        assert [k.fingerprint for k in signing.given_keys([value])] == [hashlib.sha256(raw).hexdigest()], value
    assert [k.source for k in signing.given_keys([lines])] == [f"key file {lines}: ci runner 3"]
    assert signing.given_keys(str(pem)) == signing.given_keys([pem])  # one key, not in a list


@pytest.mark.parametrize("value, error", [
    (b"\0" * 31, r"trusted_keys: a raw Ed25519 public key is 32 bytes, not 31"),
    (7, r"trusted_keys: int is not a key"),
    ("no/such/key.pub", r"cannot read the key file 'no/such/key.pub'"),
])
def test_a_value_that_is_not_a_key_is_refused_even_for_an_unsigned_file(compiled, value, error):
    with pytest.raises(omrt.InputError, match=error):
        omrt.load(compiled, trusted_keys=[value])


def test_a_bad_line_in_a_key_file_names_the_file_and_line(signed, tmp_path, monkeypatch):
    bad = tmp_path / "trusted_keys"
    bad.write_text("# mine\n" + "ab" * 32 + " ok\nssh-ed25519 AAAA\n")
    why = rf"{bad}:3: 'ssh-ed25519' is not a public key: expected 64 hex digits or the base64 of 32 bytes"
    with pytest.raises(omrt.InputError, match=why):
        signing.given_keys([bad])
    monkeypatch.setenv("OMRT_TRUSTED_KEYS", str(bad))
    with pytest.raises(omrt.InputError, match=why):
        omrt.load(signed)  # the keys file is read for a signed file
    private = tmp_path / "private"
    signing.keygen(private)
    with pytest.raises(omrt.InputError, match=r"is a private key; trust its public key"):
        signing.given_keys([private])


# --- signing ------------------------------------------------------------------------------------

def test_signing_covers_every_partition_but_the_signature_and_rewrites_in_place(compiled, keys, tmp_path):
    path = str(tmp_path / "cnn.om")
    with open(path, "wb") as f:
        f.write(_read(compiled))
    os.chmod(path, 0o644)
    before = OmFile(compiled)
    fingerprint, parts = signing.sign(path, keys["alice"][0])
    assert (fingerprint, parts) == (keys["alice"][1], ["MODEL_DEF", "WEIGHTS", "KERNELS", "PLANS", "ENV", "type 99"])
    after = OmFile(path)
    assert after.version == before.version == VERSION and after.flags == before.flags == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert {t: (e.size, e.digest) for t, e in after.entries.items() if t != Part.SIGNATURE} == \
        {t: (e.size, e.digest) for t, e in before.entries.items()}
    record = read_signature(after)
    assert record.fingerprint == keys["alice"][1] and record.algorithm == "ed25519"
    public = serialization.load_pem_private_key(open(keys["alice"][0], "rb").read(), None).public_key()
    public.verify(record.signature, file_message(after))  # raises unless the signature holds
    assert file_message(after).decode().splitlines()[:4] == [
        "omrt signed model 1", f"version {VERSION[0]}.{VERSION[1]}", "flags 1", "reserved " + "00" * 28]
    assert len(file_message(after).decode().splitlines()) == 4 + 6
    assert os.listdir(tmp_path) == ["cnn.om"]  # nothing left beside it

    signing.sign(path, keys["mallory"][0])  # signing again replaces the signature
    again = OmFile(path)
    assert {t: e.digest for t, e in again.entries.items() if t != Part.SIGNATURE} == \
        {t: e.digest for t, e in after.entries.items() if t != Part.SIGNATURE} and len(again.entries) == 7
    assert read_signature(again).fingerprint == keys["mallory"][1]
    alice, warned = _quiet_load(path, trusted_keys=[keys["alice"][0] + ".pub"])
    assert not alice.trust and f"signed by key {keys['mallory'][1][:16]}" in warned[0]


def test_the_signed_message_changes_with_any_signed_field():
    entries = [Entry(t, 0, 4096 * t, 10 * t, bytes([t]) * 32) for t in (1, 2, 3, 7, 99)]
    base = message((1, 3), 1, bytes(28), entries)
    assert signed_parts(e.type for e in entries) == [1, 2, 3, 99]
    moved = [Entry(e.type, 0, e.offset + 4096, e.size, e.digest) for e in entries]
    assert message((1, 3), 1, bytes(28), moved) == base  # where a partition lies is not signed: its bytes are
    changed = [message((1, 4), 1, bytes(28), entries), message((1, 3), 3, bytes(28), entries),
               message((1, 3), 1, b"\1" + bytes(27), entries),
               message((1, 3), 1, bytes(28), entries[:-1]),
               message((1, 3), 1, bytes(28), entries[:1] + [Entry(2, 1, 0, 20, b"\2" * 32)] + entries[2:]),
               message((1, 3), 1, bytes(28), entries[:1] + [Entry(2, 0, 0, 21, b"\2" * 32)] + entries[2:]),
               message((1, 3), 1, bytes(28), entries[:1] + [Entry(2, 0, 0, 20, b"\3" * 32)] + entries[2:])]
    assert len({base, *changed}) == 1 + len(changed)
    with_signature = entries[:3] + [Entry(7, 0, 0, 99, b"\7" * 32)] + entries[4:]
    assert message((1, 3), 1, bytes(28), with_signature) == base  # the signature does not sign itself


def test_signing_refuses_a_corrupted_file_and_writes_nothing(compiled, keys, tmp_path):
    path = str(tmp_path / "cnn.om")
    data = bytearray(_read(compiled))
    weights = OmFile(compiled).entry(Part.WEIGHTS)
    data[weights.offset] ^= 1
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(omrt.InputError, match=r"the WEIGHTS partition does not match its digest: the file is "
                                              r"corrupted and was not signed"):
        signing.sign(path, keys["alice"][0])
    assert _read(path) == bytes(data) and os.listdir(tmp_path) == ["cnn.om"]


def test_signing_needs_an_ed25519_private_key(compiled, tmp_path):
    ec_key = tmp_path / "ec.pem"
    ec_key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(omrt.InputError, match=r"ec.pem' holds a private key of another kind than Ed25519; omrt "
                                              r"signs with Ed25519"):
        signing.sign(compiled, ec_key)
    (tmp_path / "pub").write_text("ab" * 32 + "\n")
    with pytest.raises(omrt.InputError, match=r"is not an unencrypted PEM private key"):
        signing.sign(compiled, tmp_path / "pub")


# --- the trust decision -------------------------------------------------------------------------

def test_a_file_signed_by_a_trusted_key_runs_its_native_code(signed, keys):
    public = keys["alice"][0] + ".pub"
    model, warned = _quiet_load(signed, trusted_keys=[public])
    assert warned == [] and model.trust and _runs_native(model)
    assert str(model.trust) == f"signed by key {keys['alice'][1][:16]} (key file {public}: alice)"
    assert model.trust.signer == keys["alice"][1]
    np.testing.assert_allclose(model.session().run({"x": X})["y"], reference(X), rtol=1e-5, atol=1e-5)
    raw = signing.read_key_file(public)[0].raw
    assert _runs_native(omrt.load(_read(signed), trusted_keys=[raw]))  # from memory, the raw key
    assert _runs_native(omrt.load(signed, trusted_keys=[raw.hex()], require_signature=True))


def test_an_unknown_key_is_refused_by_fingerprint_and_the_numpy_kernels_run(signed, keys):
    who = keys["alice"][1][:16]
    for trusted in (None, [keys["mallory"][0] + ".pub"]):
        model, warned = _quiet_load(signed, trusted_keys=trusted)
        assert not model.trust and model.native is None
        assert model.trust.reason.startswith(f"signed by key {who}, which is not a trusted key: pass its public key "
                                             f"in trusted_keys= or add it to the trusted keys file")
        assert model.kernels[0].status == f"not loaded: not trusted: {model.trust.reason}"
        assert warned == [f"omrt: {signed}: {model.trust.reason}; its packed code does not run (numpy kernels do)"]
        np.testing.assert_allclose(model.session().run({"x": X})["y"], reference(X), rtol=1e-5, atol=1e-5)
    with pytest.raises(omrt.SignatureError, match=rf"signed by key {who}, which is not a trusted key.*; "
                                                  r"require_signature=True refuses it"):
        omrt.load(signed, require_signature=True)


def test_an_unsigned_file_is_not_trusted_quietly_unless_a_signature_is_required(compiled, keys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = omrt.load(compiled, trusted_keys=[keys["alice"][0] + ".pub"])
    assert str(model.trust) == "not signed" and model.trust.signer is None and model.native is None
    assert model.kernels[0].status == ("not loaded: not trusted: not signed: sign it (omrt sign) and trust its key, "
                                       "or load with trust_kernels=True")
    with pytest.raises(omrt.SignatureError, match=r"cnn.om: not signed; require_signature=True refuses it"):
        omrt.load(compiled, require_signature=True)
    trusted = omrt.load(compiled, trust_kernels=True)
    assert str(trusted.trust) == "trust_kernels=True" and _runs_native(trusted)
    with pytest.raises(omrt.InputError, match=r"pass one of the two"):
        omrt.load(compiled, trust_kernels=True, require_signature=True)


def _rewrite_signature(path: str, target: str, fields: bytes) -> None:
    """Copy the signed file with its SIGNATURE partition replaced by `fields` (and its digest updated)."""
    f = OmFile(path)
    try:
        parts = [(e.type, lambda sink, e=e: sink(f.map[e.offset:e.offset + e.size]))
                 for e in sorted(f.entries.values(), key=lambda e: e.offset) if e.type != Part.SIGNATURE]
        write(target, parts + [(Part.SIGNATURE, lambda sink: sink(fields))], flags=f.flags)
    finally:
        f.close()


@pytest.mark.parametrize("fields, why", [
    (b"{not json", r"the signature cannot be read: .*the SIGNATURE partition is damaged \(JSONDecodeError"),
    (b'{"fingerprint": 3}', r"the signature cannot be read: .*damaged \(KeyError: 'signature'\)"),
    (Signature("ab" * 32, b"\0" * 64, algorithm="rsa").encode(),
     r"signed by key abababababababab with 'rsa' over 'omrt signed model 1', which this omrt does not check"),
    (Signature("ab" * 32, b"\0" * 64, message="omrt signed model 2").encode(), r"which this omrt does not check"),
])
def test_a_signature_this_omrt_cannot_read_is_refused(signed, tmp_path, fields, why):
    path = str(tmp_path / "odd.om")
    _rewrite_signature(signed, path, fields)
    model, warned = _quiet_load(path, trusted_keys=[bytes(32)])
    assert not model.trust and model.native is None and len(warned) == 1
    assert re.search(why, model.trust.reason), model.trust.reason


def test_the_signature_of_another_file_does_not_verify(signed, keys, tmp_path):
    other = str(tmp_path / "other.om")
    omrt.compile(cnn_model(), other, native=False)
    signing.sign(other, keys["alice"][0])
    spliced = str(tmp_path / "spliced.om")
    _rewrite_signature(signed, spliced, bytes(OmFile(other).view(Part.SIGNATURE)))
    model, warned = _quiet_load(spliced, trusted_keys=[keys["alice"][0] + ".pub"])
    assert not model.trust and model.native is None
    assert model.trust.reason == (f"the signature by key {keys['alice'][1][:16]} does not verify: the file (its "
                                  f"header, partition table or a signed partition) was changed after it was signed")


# --- tampering ----------------------------------------------------------------------------------

def _layout(data: bytes) -> tuple[int, dict[int, tuple[int, int]]]:
    """The partition count and each partition's (offset, size), from the file's own table."""
    count = HEADER.unpack_from(data, 0)[4]
    spans = {}
    for i in range(count):
        kind, _, offset, size, _ = ENTRY.unpack_from(data, HEADER.size + i * ENTRY.size)
        spans[kind] = (offset, size)
    return count, spans


def _tampered(data: bytes, flips: list[tuple[int, int]], rewrite: bool) -> bytes:
    """`data` with the bytes at the given positions xor-ed with their masks; with `rewrite`, the
    stored digests are recomputed over the partitions the changed table points at, as an attacker
    who knows the format would (but not a digest the flips themselves change)."""
    out = bytearray(data)
    for pos, mask in flips:
        out[pos] ^= mask
    count, _ = _layout(data)
    for i in range(count if rewrite else 0):
        at = HEADER.size + i * ENTRY.size
        kind, flags, offset, size, _ = ENTRY.unpack_from(out, at)
        digest_field = range(at + ENTRY.size - 32, at + ENTRY.size)
        if offset + size <= len(out) and not any(pos in digest_field for pos, _ in flips):
            out[at:at + ENTRY.size] = ENTRY.pack(kind, flags, offset, size,
                                                 hashlib.sha256(out[offset:offset + size]).digest())
    return bytes(out)


def _refused(data: bytes, public: str) -> str:
    """How a load with the signer's key trusted refuses the file's packed code: "load error"
    (FormatError), or "not trusted" (it loads and warns with the reason, its kernels' status names
    it, no native library), or "not trusted, then <error>": damage to a signed partition that
    still decodes (a changed shape, a plan that does not fit) surfaces as another OmrtError after
    the trust decision refused the code and warned. Any other exception fails the test. Fails the test when the packed code runs."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        try:
            model = omrt.load(data, trusted_keys=[public])
        except omrt.FormatError:
            return "load error"
        except omrt.OmrtError as e:  # omrt's own error, naming what is wrong, after the refusal
            assert any("its packed code does not run" in str(w.message) for w in got), e
            return f"not trusted, then {type(e).__name__}"
    assert not model.trust and model.native is None, model.trust
    assert all(k.status.startswith(f"not loaded: not trusted: {model.trust.reason}") for k in model.kernels)
    assert got or str(model.trust) == "not signed", "a signed file refused without a warning"
    return "not trusted"


def _positions(offset: int, size: int) -> list[int]:
    """Every byte of a small partition; 256 spread over a large one, its first and last included."""
    if size <= 4096:
        return list(range(offset, offset + size))
    return sorted({offset + size - 1, *range(offset, offset + size, max(1, size // 256))})


def test_a_signed_file_tampered_with_in_any_part_is_refused_every_time(signed, keys):
    """The figure: flip each byte of the header and table, and bytes of every partition (the
    signature's own included) rewriting the stored digests, and load with the signer's key trusted."""
    data, public = _read(signed), keys["alice"][0] + ".pub"
    assert _runs_native(_quiet_load(data, trusted_keys=[public])[0])
    count, spans = _layout(data)
    assert sorted(spans) == [1, 2, 3, 4, 5, 7, LATER]
    cases = [("header", [(pos, mask)]) for pos in range(HEADER.size) for mask in (0x01, 0x80)]
    cases += [("table", [(pos, 0x01)]) for pos in range(HEADER.size, HEADER.size + count * ENTRY.size)]
    for kind, (offset, size) in spans.items():
        cases += [(str(kind), [(pos, 0x01)]) for pos in _positions(offset, size)]
    outcomes: dict[tuple[str, str], int] = {}
    for where, flips in cases:
        how = _refused(_tampered(data, flips, rewrite=True), public)
        where = "partition" if where.isdigit() else where
        outcomes[where, how] = outcomes.get((where, how), 0) + 1
    print(f"\ntampered cases: {len(cases)}, all refused: {dict(sorted(outcomes.items()))}")
    assert sum(outcomes.values()) == len(cases) > 3000


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_tampering_anywhere_signed_is_refused(signed, keys, data):
    """Several bytes at once, anywhere in the header, table or a partition, digests rewritten."""
    raw = _read(signed)
    count, spans = _layout(raw)
    regions = [(0, HEADER.size + count * ENTRY.size)] + list(spans.values())
    flips = data.draw(st.lists(st.tuples(st.sampled_from(regions), st.integers(0, 1 << 30), st.integers(1, 255)),
                               min_size=1, max_size=6))
    positions = [(start + at % size, mask) for (start, size), at, mask in flips]
    tampered = _tampered(raw, positions, rewrite=True)
    if tampered == raw:
        return  # the flips cancelled out
    _refused(tampered, keys["alice"][0] + ".pub")


def test_a_partition_changed_without_its_digest_is_named(signed, keys):
    data, public = _read(signed), keys["alice"][0] + ".pub"
    _, spans = _layout(data)
    later = _tampered(data, [(spans[LATER][0] + 3, 0x20)], rewrite=False)
    model, warned = _quiet_load(later, trusted_keys=[public])
    assert not model.trust and model.native is None
    assert model.trust.reason == (f"signed by key {keys['alice'][1][:16]}, but the type 99 partition no longer "
                                  f"matches its digest: the file was changed after it was signed")
    kernels = _tampered(data, [(spans[Part.KERNELS][0] + 100, 0x01)], rewrite=False)
    with pytest.raises(omrt.FormatError, match=r"the KERNELS partition does not match its digest"):
        omrt.load(kernels, trusted_keys=[public])


def test_a_record_of_a_kind_this_omrt_does_not_know_says_so_and_never_runs(signed, keys):
    """The byte after a record's magic is its kind: the native library's record changed to kind 0
    (digests rewritten) is refused with the signature, every record's status naming the reason;
    loaded trusted all the same, the record says its kind is unknown and the model runs on numpy,
    as the plain file's unpacked kernels do."""
    data, public = _read(signed), keys["alice"][0] + ".pub"
    _, spans = _layout(data)
    changed = _tampered(data, [(spans[Part.KERNELS][0] + 8, 0x01)], rewrite=True)
    assert _refused(changed, public) == "not trusted"
    model, _ = _quiet_load(changed, trust_kernels=True)
    assert [(k.kind, k.status) for k in model.kernels] == [
        (0, "not loaded: its kind (0) is not one this omrt knows (a later omrt's, or damage)")]
    assert model.native is None
    x = np.random.default_rng(0).standard_normal(model.inputs[0].shape).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = omrt.load(data).session().run({model.inputs[0].name: x})
    got = model.session().run({model.inputs[0].name: x})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_weights_are_signed_by_their_digest_which_verify_checks(signed, keys):
    """The documented rule: the signature covers WEIGHTS through its digest; a load checks that
    digest only with verify=True (hashing reads every weight). Weights are data the packed code
    reads through checked arrays: they change results, never which code runs."""
    data, public = _read(signed), keys["alice"][0] + ".pub"
    offset, size = _layout(data)[1][Part.WEIGHTS]
    changed = _tampered(data, [(offset + size // 2, 0x40)], rewrite=False)
    assert _quiet_load(changed, trusted_keys=[public])[0].trust
    with pytest.raises(omrt.FormatError, match=r"the WEIGHTS partition does not match its digest"):
        omrt.load(changed, trusted_keys=[public], verify=True)
    rewritten = _tampered(data, [(offset + size // 2, 0x40)], rewrite=True)
    assert "does not verify" in _quiet_load(rewritten, trusted_keys=[public])[0].trust.reason


def test_a_file_re_signed_by_the_attacker_is_refused_by_fingerprint(signed, keys, tmp_path):
    path = str(tmp_path / "resigned.om")
    _, spans = _layout(_read(signed))
    with open(path, "wb") as f:
        f.write(_tampered(_read(signed), [(spans[Part.KERNELS][0] + 4000, 0x01)], rewrite=True))
    signing.sign(path, keys["mallory"][0])
    model, warned = _quiet_load(path, trusted_keys=[keys["alice"][0] + ".pub"])
    assert not model.trust and model.native is None
    assert warned and f"signed by key {keys['mallory'][1][:16]}, which is not a trusted key" in warned[0]


# --- real processes: the keys file, the CLI, imports --------------------------------------------

def _env(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMRT_TRUSTED_KEYS", "XDG_CONFIG_HOME")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: v for k, v in changes.items() if v is not None})
    return env


def _omrt(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omrt.cli", *args], capture_output=True, text=True, env=env)


def test_the_keys_file_in_the_config_folder_trusts_in_a_fresh_process(signed, keys, tmp_path):
    who = keys["alice"][1][:16]
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    default = home / ".config" / "omrt" / "trusted_keys"
    default.parent.mkdir(parents=True)
    default.write_text("# keys of our build hosts\n" + open(keys["alice"][0] + ".pub").read())
    out = _omrt("inspect", signed, env=_env(HOME=str(home)))
    assert out.returncode == 0, out.stderr
    assert f"trust: yes, signed by key {who} (trusted keys file {default}: alice)" in out.stdout
    assert "  omrt-native for " in out.stdout and "\n    loaded\n" in out.stdout
    assert f"signature: ed25519 by key {who}, over the header and MODEL_DEF, WEIGHTS, KERNELS, PLANS, ENV, " \
           f"type 99" in out.stdout

    (xdg / "omrt").mkdir(parents=True)  # XDG_CONFIG_HOME wins over ~/.config
    (xdg / "omrt" / "trusted_keys").write_text(open(keys["mallory"][0] + ".pub").read())
    out = _omrt("inspect", signed, env=_env(HOME=str(home), XDG_CONFIG_HOME=str(xdg)))
    assert f"trust: no, signed by key {who}, which is not a trusted key" in out.stdout
    assert "RuntimeWarning" in out.stderr and f"trusted keys file {xdg}/omrt/trusted_keys" in out.stderr
    out = _omrt("inspect", signed, env=_env(HOME=str(home), XDG_CONFIG_HOME=str(xdg), OMRT_TRUSTED_KEYS=str(default)))
    assert f"trust: yes, signed by key {who} (trusted keys file {default}: alice)" in out.stdout
    out = _omrt("run", signed, "--require-signature", env=_env(HOME=str(home), XDG_CONFIG_HOME=str(xdg)))
    assert out.returncode == 2 and f"omrt: error: {signed}: signed by key {who}, which is not a trusted key" \
        in out.stderr and "require_signature=True refuses it" in out.stderr
    out = _omrt("run", signed, "--require-signature", "--trusted-key", keys["alice"][0] + ".pub",
                env=_env(HOME=str(home), XDG_CONFIG_HOME=str(xdg)))
    assert out.returncode == 0 and "output 'y'" in out.stdout, out.stderr


def test_keygen_and_sign_on_the_command_line(compiled, tmp_path):
    env = _env(HOME=str(tmp_path))
    out = _omrt("keygen", str(tmp_path / "key"), "--comment", "release key", env=env)
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "key").st_mode) == 0o600
    fingerprint = signing.read_key_file(tmp_path / "key.pub")[0].fingerprint
    assert f"public key {tmp_path / 'key'}.pub: key {fingerprint[:16]}" in out.stdout
    assert f"add {tmp_path / 'key'}.pub to {tmp_path}/.config/omrt/trusted_keys" in out.stdout
    assert _omrt("keygen", str(tmp_path / "key"), env=env).returncode == 2
    model = str(tmp_path / "m.om")
    with open(model, "wb") as f:
        f.write(_read(compiled))
    out = _omrt("sign", model, "--key", str(tmp_path / "key"), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (f"{model}: signed by key {fingerprint[:16]} (sha256 {fingerprint}); covers the header "
                          f"and MODEL_DEF, WEIGHTS, KERNELS, PLANS, ENV, type 99\n")
    out = _omrt("run", model, "--trusted-key", str(tmp_path / "key.pub"), "--require-signature", env=env)
    assert out.returncode == 0 and "output 'y'" in out.stdout, out.stderr


IMPORTS = ("import sys, warnings, omrt\n"
           "warnings.simplefilter('ignore')\n"
           "m = omrt.load(sys.argv[1], trusted_keys=sys.argv[2:] or None)\n"
           "print(bool(m.trust), 'cryptography' in sys.modules)\n")


def test_cryptography_is_imported_only_to_check_a_signature_by_a_trusted_key(compiled, signed, keys, tmp_path):
    env = _env(HOME=str(tmp_path))

    def run(*args: str) -> str:
        out = subprocess.run([sys.executable, "-c", IMPORTS, *args], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert run(compiled, keys["alice"][0] + ".pub") == "False False"  # unsigned: no signature to check
    assert run(signed) == "False False"  # signed by a key nobody trusts here
    assert run(signed, keys["mallory"][0] + ".pub") == "False False"
    assert run(signed, keys["alice"][0] + ".pub") == "True True"


BLOCK_CRYPTOGRAPHY = ("import sys\n"
                      "class Block:\n"
                      "    def find_spec(self, name, path=None, target=None):\n"
                      "        if name.split('.')[0] == 'cryptography':\n"
                      "            raise ImportError('blocked: ' + name)\n"
                      "sys.meta_path.insert(0, Block())\n")


def test_without_cryptography_a_signature_cannot_be_checked_and_the_error_says_what_to_install(signed, keys,
                                                                                              tmp_path):
    code = BLOCK_CRYPTOGRAPHY + ("import warnings, omrt\n"
                                 "with warnings.catch_warnings(record=True) as got:\n"
                                 "    warnings.simplefilter('always')\n"
                                 f"    m = omrt.load({signed!r}, trusted_keys=[{keys['alice'][0] + '.pub'!r}])\n"
                                 "print(bool(m.trust), m.native is None)\n"
                                 "print(got[0].message)\n"
                                 "from omrt.cli import main\n"
                                 f"sys.exit(main(['sign', {signed!r}, '--key', {keys['alice'][0]!r}]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(HOME=str(tmp_path)))
    lines = out.stdout.splitlines()
    assert lines[0] == "False True"
    assert (f"signed by key {keys['alice'][1][:16]}, which is trusted, but signatures need the cryptography "
            f"package, which is not installed: pip install omrt[sign]") in lines[1]
    assert out.returncode == 2
    assert "omrt: error: signatures need the cryptography package, which is not installed: pip install omrt[sign]" \
        in out.stderr


@pytest.mark.parametrize("tamper", [False, True])
def test_a_signature_decides_whether_packed_custom_operators_run(keys, tmp_path, tamper):
    """Custom operators travel in CUSTOM_OPS and KERNELS records: signed like the rest, and run
    only under the same trust decision."""
    from test_custom_ops import W, chain_model, mish_op, mish_reference

    path = str(tmp_path / "chain.om")
    omrt.compile(chain_model(ops=("Mish",)), path, custom_ops=[mish_op()], native=False)
    signing.sign(path, keys["alice"][0])
    if tamper:  # a Python kernel changed after signing, every digest rewritten to match
        f = OmFile(path)
        start = f.entries[Part.KERNELS].offset
        before = unpack(memoryview(f.read(Part.KERNELS)), path)
        f.close()
        data = bytearray(_read(path))
        at = data.index(b"np.tanh", start)
        data[at:at + 7] = b"np.sinh"
        (old,) = [hashlib.sha256(r.data).hexdigest().encode() for r in before if r.kind == PYTHON_OP]
        new = hashlib.sha256(before[0].data.replace(b"np.tanh", b"np.sinh")).hexdigest().encode()
        data = data.replace(old, new)  # the digest CUSTOM_OPS names for the record
        with open(path, "wb") as out:
            out.write(_tampered(bytes(data), [], rewrite=True))
    model, warned = _quiet_load(path, trusted_keys=[keys["alice"][0] + ".pub"])
    assert [op.status == "ready" for op in model.custom_ops] == [not tamper]
    assert bool(warned) == tamper
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    if tamper:
        with pytest.raises(omrt.KernelError, match=r"com\.acme::Mish .* cannot run: .*not trusted"):
            model.session().run({"x": x})
    else:
        got = model.session().run({"x": x})["y"]
        want = mish_reference(x @ W) + x
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(float(np.abs(want).max()), 1.0))
