"""gRPC authentication (issue 17, item 6; issue 29, items 6 and 7) against the real `drafter
serve` and server: bearer tokens and mutual TLS; an unauthenticated caller is refused
(UNAUTHENTICATED) before its message is read and learns nothing, probes stay open, a
certificate without a usable name is refused, and one client's request ids cannot touch
another's."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from client_servers import DrafterProcess
from grpc_health.v1 import health_pb2, health_pb2_grpc
from service_support import FakeClock, LoopThread, config, delta, serving

from drafter_service.edge.grpc_auth import TokenFile
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc
from verifier_client import BudgetRule, DrafterClient
from verifier_client.engines import DrafterSettings, EngineDrafter

PATTERN = [10, 11, 12, 13, 14, 15]
ALPHA, BETA = "alpha-token-0123456789", "beta-token-0123456789ab"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DrafterProcess]:
    root = tmp_path_factory.mktemp("auth")
    tokens = root / "tokens"
    tokens.write_text(f"# clients of this drafter\nalpha {ALPHA}\nbeta {BETA}\n")
    server = DrafterProcess(root / "data", "--grpc-tokens-file", str(tokens))
    yield server
    server.stop()


def _client(server: DrafterProcess, token: str | None) -> DrafterClient:
    client = DrafterClient(server.target, deadline_ms=60_000, budget=BudgetRule.fixed(4),
                           token=token)  # fmt: skip
    client.wait_ready()
    return client


def test_calls_without_a_valid_token_are_unauthenticated(guarded: DrafterProcess) -> None:
    with grpc.insecure_channel(guarded.target) as channel:
        stub = pb_grpc.DrafterServiceStub(channel)
        ingest = pb.IngestRequest(sequences=[pb.TokenSequence(tokens=[1, 2])])
        calls = [
            lambda md: stub.GetServiceInfo(pb.GetServiceInfoRequest(), metadata=md, timeout=5),
            lambda md: stub.Ingest(ingest, metadata=md, timeout=5),
            lambda md: stub.Draft(pb.DraftRequest(), metadata=md, timeout=5),
            lambda md: stub.Finish(pb.FinishRequest(), metadata=md, timeout=5),
        ]
        for metadata in [(), (("authorization", "Bearer wrong-token-0123456789"),),
                         (("authorization", ALPHA),)]:  # fmt: skip
            for call in calls:
                with pytest.raises(grpc.RpcError) as refused:
                    call(metadata)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Probes need no token.
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="sssd_drafter.v1.DrafterService"), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_one_clients_request_ids_cannot_touch_anothers(guarded: DrafterProcess) -> None:
    alpha, beta = _client(guarded, ALPHA), _client(guarded, BETA)
    try:
        alpha.add_request("r1", [*PATTERN, *PATTERN])
        assert alpha.step({"r1": []}).ok
        # beta uses the same id: a restart (whole context) and then a finish, on its own.
        beta.add_request("r1", [7, 8, 9, 7, 8, 9, 7])
        tree = beta.step({"r1": []})["r1"]
        assert tree is not None and tree.best_chain(2) == [8, 9]
        beta.finish("r1")
        assert beta.flush(10)
        result = alpha.step({"r1": [10]})  # alpha's delta still matches alpha's state
        assert result.resynced == frozenset() and alpha.stats.resyncs == 0
        tree = result["r1"]
        assert tree is not None and tree.best_chain(2) == [11, 12]
    finally:
        alpha.close()
        beta.close()


def test_an_engine_plugin_authenticates_with_its_token_file(
    guarded: DrafterProcess, tmp_path: Path
) -> None:
    token = tmp_path / "engine-token"
    token.write_text(ALPHA + "\n")
    settings = DrafterSettings(address=guarded.target, deadline_ms=60_000, budget="4",
                               token_file=str(token))  # fmt: skip
    engine = EngineDrafter(settings)
    try:
        context = [*PATTERN, *PATTERN]
        trees = engine.draft(["e1"], [len(context)], [len(context)],
                             lambda row, a, b: context[a:b])  # fmt: skip
        assert trees[0] is not None and engine.stats.fallback_steps == 0
    finally:
        engine.close()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificates(root: Path, **clients: str) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and client certificates: ``client`` (CN
    gamma) and one per keyword (its subject)."""
    root.mkdir(parents=True, exist_ok=True)
    subjects = {"client": "/CN=gamma", **clients}
    files = {f"{who}.{kind}": root / f"{who}.{kind}"
             for who in ("ca", "server", *subjects) for kind in ("key", "pem")}  # fmt: skip
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", str(files["ca.key"]), "-out", str(files["ca.pem"]))  # fmt: skip
    signed = [("server", "/CN=drafter", "subjectAltName=IP:127.0.0.1")]
    signed += [(who, subject, "extendedKeyUsage=clientAuth") for who, subject in subjects.items()]
    for who, subject, extension in signed:
        csr = root / f"{who}.csr"
        ext = root / f"{who}.ext"
        ext.write_text(extension + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                 "-keyout", str(files[f"{who}.key"]), "-out", str(csr))  # fmt: skip
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(files["ca.pem"]), "-CAkey",
                 str(files["ca.key"]), "-CAcreateserial", "-days", "2", "-extfile", str(ext),
                 "-out", str(files[f"{who}.pem"]))  # fmt: skip
    return files


@pytest.fixture(scope="module")
def mutual(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[DrafterProcess, dict[str, Path]]]:
    """`drafter serve` with mutual TLS and no tokens, and certificates for: gamma, a
    client without a common name, CN ``a`` and CN ``a/b``."""
    root = tmp_path_factory.mktemp("mtls")
    certs = _certificates(root / "certs", nameless="/O=drafter-tests", a="/CN=a", ab="/CN=a\\/b")
    server = DrafterProcess(
        root / "data", "--tls-cert-file", str(certs["server.pem"]), "--tls-key-file",
        str(certs["server.key"]), "--tls-client-ca-file", str(certs["ca.pem"]),
    )  # fmt: skip
    yield server, certs
    server.stop()


def _tls_stub(
    server: DrafterProcess, certs: dict[str, Path], who: str
) -> tuple[grpc.Channel, pb_grpc.DrafterServiceStub]:
    credentials = grpc.ssl_channel_credentials(
        certs["ca.pem"].read_bytes(), certs[f"{who}.key"].read_bytes(),
        certs[f"{who}.pem"].read_bytes(),
    )  # fmt: skip
    channel = grpc.secure_channel(server.target, credentials)
    return channel, pb_grpc.DrafterServiceStub(channel)


def test_mutual_tls_admits_only_certified_clients(
    mutual: tuple[DrafterProcess, dict[str, Path]],
) -> None:
    server, certs = mutual
    ca = certs["ca.pem"].read_bytes()
    anonymous = DrafterClient(server.target, deadline_ms=500,
                              credentials=grpc.ssl_channel_credentials(ca))  # fmt: skip
    with pytest.raises(grpc.RpcError):  # the TLS handshake refuses a client without a cert
        anonymous.wait_ready(timeout_s=3)
    anonymous.close()
    settings = DrafterSettings(
        address=server.target, deadline_ms=60_000, budget="4", tls_ca_file=str(certs["ca.pem"]),
        tls_cert_file=str(certs["client.pem"]), tls_key_file=str(certs["client.key"]),
    )  # fmt: skip
    engine = EngineDrafter(settings)
    try:
        context = [*PATTERN, *PATTERN]
        trees = engine.draft(["m1"], [len(context)], [len(context)],
                             lambda row, a, b: context[a:b])  # fmt: skip
        assert trees[0] is not None and trees[0].best_chain(2) == [10, 11]
    finally:
        engine.close()


def test_a_certificate_without_a_common_name_is_refused(
    mutual: tuple[DrafterProcess, dict[str, Path]],
) -> None:
    server, certs = mutual
    channel, stub = _tls_stub(server, certs, "nameless")
    with channel:
        for call, request in ((stub.Draft, pb.DraftRequest(requests=[pb.RequestDelta(
                request_id="n1", new_tokens=PATTERN, budget=4)])),
                              (stub.GetServiceInfo, pb.GetServiceInfoRequest())):  # fmt: skip
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "no common name" in refused.value.details()
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING  # probes stay open


def test_certificate_names_cannot_reach_each_others_request_ids(
    mutual: tuple[DrafterProcess, dict[str, Path]],
) -> None:
    """CN ``a`` with id ``b/y`` and CN ``a/b`` with id ``y`` would both be ``a/b/y``: a CN
    with "/" is not a client name, so the second is refused and ``a``'s request is intact."""
    server, certs = mutual
    context = [*PATTERN, *PATTERN]
    a_channel, a = _tls_stub(server, certs, "a")
    ab_channel, ab = _tls_stub(server, certs, "ab")
    with a_channel, ab_channel:
        start = pb.RequestDelta(request_id="b/y", new_tokens=context, budget=4)
        (draft,) = a.Draft(pb.DraftRequest(requests=[start]), timeout=5).drafts
        assert draft.status == pb.DRAFT_STATUS_OK and draft.length == len(context)
        steal = pb.RequestDelta(request_id="y", known_length=len(context), new_tokens=[1], budget=4)
        for call, request in ((ab.Draft, pb.DraftRequest(requests=[steal])),
                              (ab.Finish, pb.FinishRequest(requests=[pb.FinishedRequest(
                                  request_id="y")]))):  # fmt: skip
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "'a/b' is not a client name" in refused.value.details()
        step = pb.RequestDelta(request_id="b/y", known_length=len(context), new_tokens=[10],
                               budget=4)  # fmt: skip
        (draft,) = a.Draft(pb.DraftRequest(requests=[step]), timeout=5).drafts
        assert draft.status == pb.DRAFT_STATUS_OK and draft.length == len(context) + 1
        assert list(draft.tokens[:1]) == [11]


def _ingest_bytes(tokens: int) -> bytes:
    """A valid serialized IngestRequest of one sequence of ``tokens`` sevens, built
    without a message object (a big one would be slow to build)."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    sequence = b"\x0a" + varint(tokens) + b"\x07" * tokens  # TokenSequence.tokens, packed
    return b"\x12" + varint(len(sequence)) + sequence  # IngestRequest.sequences


def test_an_unauthenticated_call_is_refused_before_its_message_is_read(tmp_path: Path) -> None:
    assert (
        _ingest_bytes(3)
        == pb.IngestRequest(sequences=[pb.TokenSequence(tokens=[7, 7, 7])]).SerializeToString()
    )
    big = _ingest_bytes(48 << 20)  # 48 MB: parsing it would take a while and much memory
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alpha {ALPHA}\n")
    loop = LoopThread()
    try:
        with serving(loop, config(tmp_path / "data", grpc_tokens_file=tokens)) as running:
            gate, registry = running.server.gate, running.server.registry
            assert gate is not None
            ingest = running.channel.unary_unary(
                "/sssd_drafter.v1.DrafterService/Ingest",
                response_deserializer=pb.IngestResponse.FromString,
            )  # sends the bytes as they are
            stream = running.channel.stream_stream(
                "/sssd_drafter.v1.DrafterService/DraftStream",
                response_deserializer=pb.DraftResponse.FromString,
            )
            for metadata in [(), (("authorization", "Bearer wrong-token-0123456789"),)]:
                with pytest.raises(grpc.RpcError) as refused:
                    ingest(big, metadata=metadata, timeout=30)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.RpcError) as refused:
                    list(stream(iter([big]), metadata=metadata, timeout=30))
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert gate.messages_read == 0  # not one of them was received and parsed
            for method in ("Ingest", "DraftStream"):
                assert (
                    registry.get_sample_value(
                        "sssd_drafter_rpc_errors_total",
                        {"method": method, "code": "UNAUTHENTICATED"},
                    )
                    == 2
                )
            bearer = (("authorization", f"Bearer {ALPHA}"),)
            assert ingest(_ingest_bytes(3), metadata=bearer, timeout=10).accepted == 1
            assert gate.messages_read == 1  # an admitted call's message is
    finally:
        loop.close()


def test_the_gate_hands_the_callers_namespace_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's check names the client for the method it admits: the tokens are looked
    at once per admitted call (not again by the servicer), a unary call's and a stream's."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alpha {ALPHA}\n")
    loop = LoopThread()
    try:
        with serving(loop, config(tmp_path / "data", grpc_tokens_file=tokens)) as running:
            token_file = running.server.auth.tokens
            assert token_file is not None
            looks = 0
            current = token_file.current

            def counted() -> dict[str, str]:
                nonlocal looks
                looks += 1
                return current()

            monkeypatch.setattr(token_file, "current", counted)
            bearer = (("authorization", f"Bearer {ALPHA}"),)
            info = running.stub.GetServiceInfo(pb.GetServiceInfoRequest(), metadata=bearer,
                                               timeout=10)  # fmt: skip
            assert info.version and looks == 1
            requests = [pb.DraftRequest(requests=[delta("r1", [1, 2, 3])]),
                        pb.DraftRequest(requests=[delta("r1", [4], known_length=3)])]  # fmt: skip
            steps = list(running.stub.DraftStream(iter(requests), metadata=bearer, timeout=10))
            assert len(steps) == 2 and looks == 2
    finally:
        loop.close()


def test_a_changed_tokens_file_takes_effect_without_a_restart(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alpha {ALPHA}\n")
    server = DrafterProcess(tmp_path / "data", "--grpc-tokens-file", str(tokens))
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.DrafterServiceStub(channel)

            def code(token: str) -> grpc.StatusCode:
                bearer = (("authorization", f"Bearer {token}"),)
                try:
                    stub.GetServiceInfo(pb.GetServiceInfoRequest(), timeout=5, metadata=bearer)
                except grpc.RpcError as err:
                    return err.code()  # type: ignore[no-any-return]
                return grpc.StatusCode.OK

            ok, refused = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED
            assert (code(ALPHA), code(BETA)) == (ok, refused)
            # The file is looked at again when a call comes, at most once a second (the
            # clock-stepped test below pins that second down): calls until it was.
            tokens.write_text(f"beta {BETA}\n")  # alpha revoked, beta added
            deadline = time.monotonic() + 60  # a bound on failure only
            while (code(ALPHA), code(BETA)) != (refused, ok):
                assert time.monotonic() < deadline, "the changed tokens file never took effect"
                time.sleep(0.05)
            # A broken edit keeps the last good tokens: beta is let in on every call, before
            # and after the server has looked at the broken file (it logs that it did).
            log = tmp_path / "data.log"
            tokens.write_text("garbage\n")
            deadline = time.monotonic() + 60  # a bound on failure only
            while "kept the previous" not in log.read_text():
                assert code(BETA) == ok
                assert time.monotonic() < deadline, "the broken tokens file was never looked at"
                time.sleep(0.05)
            assert (code(ALPHA), code(BETA)) == (refused, ok)
    finally:
        server.stop()


def test_the_tokens_file_is_looked_at_again_at_most_once_a_second(tmp_path: Path) -> None:
    """On an injected clock: a change is not seen before a second has passed since the
    last look, is seen once it has, and a broken edit keeps the last good tokens."""
    clock = FakeClock()
    path = tmp_path / "tokens"
    path.write_text(f"alpha {ALPHA}\n")
    tokens = TokenFile(path, clock)

    def rewrite(text: str) -> None:
        # A new (mtime, size) stamp whatever the file system's timestamp resolution.
        stamp = path.stat().st_mtime_ns + 10**9
        path.write_text(text)
        os.utime(path, ns=(stamp, stamp))

    assert tokens.current() == {"alpha": ALPHA}
    rewrite(f"beta {BETA}\n")  # the same size as before: only the mtime tells
    clock.now += 0.75
    assert tokens.current() == {"alpha": ALPHA}  # not looked at yet
    clock.now += 0.25
    assert tokens.current() == {"beta": BETA}
    rewrite("garbage\n")
    clock.now += 1.0
    assert tokens.current() == {"beta": BETA}  # looked at, refused, the last good kept
    rewrite(f"alpha {ALPHA}\nbeta {BETA}\n")
    clock.now += 0.5
    assert tokens.current() == {"beta": BETA}
    clock.now += 0.5
    assert tokens.current() == {"alpha": ALPHA, "beta": BETA}


@pytest.mark.system
def test_renewed_certificates_are_served_without_a_restart(tmp_path: Path) -> None:
    first, second = _certificates(tmp_path / "first"), _certificates(tmp_path / "second")
    live = {name: tmp_path / f"live-{name}" for name in ("server.pem", "server.key", "ca.pem")}
    for name, path in live.items():
        path.write_bytes(first[name].read_bytes())
    server = DrafterProcess(
        tmp_path / "data", "--tls-cert-file", str(live["server.pem"]), "--tls-key-file",
        str(live["server.key"]), "--tls-client-ca-file", str(live["ca.pem"]),
    )  # fmt: skip

    def ready(certs: dict[str, Path]) -> bool:
        settings = DrafterSettings(
            address=server.target, deadline_ms=1000, connect_timeout_s=0,
            tls_ca_file=str(certs["ca.pem"]), tls_cert_file=str(certs["client.pem"]),
            tls_key_file=str(certs["client.key"]),
        )  # fmt: skip
        tls, token = settings.credentials()
        client = DrafterClient(server.target, credentials=tls, token=token)
        try:
            client.wait_ready(timeout_s=3)
            return True
        except grpc.RpcError:
            return False
        finally:
            client.close(0.1)

    try:
        assert ready(first) and not ready(second)
        for name, path in live.items():  # what cert-manager does when it renews
            path.write_bytes(second[name].read_bytes())
        assert ready(second) and not ready(first)
    finally:
        server.stop()
