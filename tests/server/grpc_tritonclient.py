"""Triton's Python gRPC client, unmodified, against attnd's --grpc-port.

Run by check_grpc_tritonclient.sh, which starts the daemon and builds the client's stubs;
argv: the gRPC port, and the HTTP port (statistics are compared across both). With a third
and fourth argument (a CA file and a bearer token) the daemon serves TLS and wants the token:
only the TLS checks run. Each check prints "ok NAME" or "FAIL NAME: why"; the last line is
"N passed, N failed".
"""
import json
import queue
import sys
import urllib.request
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

PORT, HTTP_PORT = int(sys.argv[1]), int(sys.argv[2])
TLS_CA, TOKEN = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, None)
client = grpcclient.InferenceServerClient(f"127.0.0.1:{PORT}", ssl=TLS_CA is not None,
                                          root_certificates=TLS_CA)
rng = np.random.default_rng(7)
results = {"passed": 0, "failed": 0}


def check(name, fn):
    try:
        fn()
        results["passed"] += 1
        print(f"ok {name}")
    except Exception as e:  # every failure is reported, never fatal
        results["failed"] += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def sdpa_ref(q, k, v, causal=False):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        lq, lk = s.shape[-2], s.shape[-1]
        mask = np.tril(np.ones((lq, lk), bool), k=lk - lq)
        s = np.where(mask, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def qkv(shape, dtype=np.float32):
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


def inputs_of(arrays, datatype="FP32", names=("query", "key", "value")):
    out = []
    for name, a in zip(names, arrays):
        i = grpcclient.InferInput(name, list(a.shape), datatype)
        i.set_data_from_numpy(a)
        out.append(i)
    return out


def expect_error(code, fn):
    try:
        fn()
    except InferenceServerException as e:
        assert code in str(e.status()), f"{e.status()} ({e.message()}), expected {code}"
        return e
    raise AssertionError(f"no error, expected {code}")


def test_health_and_metadata():
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("sdpa") and client.is_model_ready("demo", "1")
    e = expect_error("NOT_FOUND", lambda: client.is_model_ready("sdpa", "7"))
    assert "version" in e.message(), e.message()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "attnd" and "binary_tensor_data" in meta["extensions"]
    m = client.get_model_metadata("sdpa", as_json=True)
    assert m["name"] == "sdpa" and m["versions"] == ["1"]
    assert [t["name"] for t in m["inputs"]][:3] == ["query", "key", "value"]
    assert m["outputs"][0]["name"] == "output"
    index = client.get_model_repository_index(as_json=True)
    names = [x["name"] for x in index["models"]]
    assert names[:2] == ["sdpa", "demo"] and all(x["state"] == "READY" for x in index["models"])
    expect_error("NOT_FOUND", lambda: client.get_model_metadata("nosuch"))


def test_config_matches_http():
    cfg = client.get_model_config("demo", as_json=True)["config"]
    with urllib.request.urlopen(f"http://127.0.0.1:{HTTP_PORT}/v2/models/demo/config") as r:
        http_cfg = json.load(r)
    assert cfg["name"] == http_cfg["name"] == "demo"
    assert [i["name"] for i in cfg["input"]] == [i["name"] for i in http_cfg["input"]]
    assert [i["data_type"] for i in cfg["input"]] == [i["data_type"] for i in http_cfg["input"]]
    assert [int(d) for d in cfg["input"][0]["dims"]] == http_cfg["input"][0]["dims"]


def test_infer_fp32_raw():
    q, k, v = qkv((1, 2, 5, 16))
    r = client.infer("sdpa", inputs_of([q, k, v]), request_id="r1")
    out = r.as_numpy("output")
    assert out.shape == (1, 2, 5, 16) and out.dtype == np.float32
    np.testing.assert_allclose(out, sdpa_ref(q, k, v), atol=1e-5)
    resp = r.get_response(as_json=True)
    assert resp["id"] == "r1" and resp["model_version"] == "1"
    assert resp["parameters"]["precision"]["string_param"] == "float32"


def test_infer_outputs_and_parameters():
    q, k, v = qkv((1, 1, 4, 8))
    outs = [grpcclient.InferRequestedOutput("output"), grpcclient.InferRequestedOutput("lse")]
    r = client.infer("sdpa", inputs_of([q, k, v]), outputs=outs, parameters={"causal": True})
    np.testing.assert_allclose(r.as_numpy("output"), sdpa_ref(q, k, v, causal=True), atol=1e-5)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(8)
    s = np.where(np.tril(np.ones((4, 4), bool)), s, -np.inf)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    np.testing.assert_allclose(r.as_numpy("lse"), lse, atol=1e-5)


def test_infer_fp16_bf16_and_precision():
    q, k, v = qkv((1, 2, 6, 8))
    r16 = client.infer("sdpa", inputs_of([x.astype(np.float16) for x in (q, k, v)], "FP16"))
    ref = sdpa_ref(*[x.astype(np.float16).astype(np.float32) for x in (q, k, v)])
    np.testing.assert_allclose(r16.as_numpy("output"), ref, atol=1e-4)
    rb = client.infer("sdpa", inputs_of([q, k, v], "BF16"), parameters={"precision": "bfloat16"})
    assert rb.get_response(as_json=True)["parameters"]["precision"]["string_param"] == "bfloat16"
    np.testing.assert_allclose(rb.as_numpy("output"), sdpa_ref(q, k, v), atol=0.05)


def test_typed_contents_with_the_generated_stub():
    # The docs' grpcurl example: typed fp32 contents, a bool parameter, through the stub alone.
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORT}"))
    req = service_pb2.ModelInferRequest(model_name="sdpa")
    req.parameters["causal"].bool_param = True
    data = {"query": [1, 0, 0, 1, 1, 1], "key": [1, 0, 0, 1, 1, 1], "value": [1, 0, 0, 2, 3, 1]}
    for name, values in data.items():
        t = req.inputs.add(name=name, datatype="FP32", shape=[3, 2])
        t.contents.fp32_contents.extend(values)
    resp = stub.ModelInfer(req)
    out = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(3, 2)
    a = {k: np.array(v, np.float32).reshape(3, 2) for k, v in data.items()}
    np.testing.assert_allclose(out, sdpa_ref(a["query"], a["key"], a["value"], causal=True),
                               atol=1e-6)
    assert list(resp.outputs[0].shape) == [3, 2]


def test_errors():
    q, k, v = qkv((1, 1, 3, 4))
    expect_error("NOT_FOUND", lambda: client.infer("nosuch", inputs_of([q, k, v])))
    bad = inputs_of([q, k[:, :, :, :2], v])
    e = expect_error("INVALID_ARGUMENT", lambda: client.infer("sdpa", bad))
    assert "key" in e.message(), e.message()
    expect_error("INVALID_ARGUMENT",
                 lambda: client.infer("sdpa", inputs_of([q, k, v]), parameters={"casual": True}))


def test_async_infer():
    done = queue.Queue()
    cases = [qkv((1, 2, 3 + i, 8)) for i in range(4)]
    for i, (q, k, v) in enumerate(cases):
        client.async_infer("sdpa", inputs_of([q, k, v]),
                           partial(lambda i, result, error: done.put((i, result, error)), i))
    for _ in cases:
        i, r, e = done.get(timeout=30)
        assert e is None, e
        np.testing.assert_allclose(r.as_numpy("output"), sdpa_ref(*cases[i]), atol=1e-5)


def test_streaming():
    got = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    cases = [qkv((1, 1, 2 + i, 8)) for i in range(3)]
    for i, (q, k, v) in enumerate(cases):
        client.async_stream_infer("sdpa", inputs_of([q, k, v]), request_id=str(i))
    client.async_stream_infer("nosuch", inputs_of(cases[0]), request_id="x")
    replies = [got.get(timeout=30) for _ in range(4)]
    client.stop_stream()
    for i in range(3):
        r, e = replies[i]
        assert e is None, e
        assert r.get_response().id == str(i)
        np.testing.assert_allclose(r.as_numpy("output"), sdpa_ref(*cases[i]), atol=1e-5)
    assert replies[3][0] is None and "nosuch" in str(replies[3][1])


def test_sequence_matches_one_causal_request():
    meta = client.get_model_metadata("demo", as_json=True)
    e = int(meta["inputs"][0]["shape"][-1])
    x = rng.standard_normal((1, 6, e)).astype(np.float32)

    def run(a, **kw):
        i = grpcclient.InferInput("input", list(a.shape), "FP32")
        i.set_data_from_numpy(a)
        return client.infer("demo", [i], **kw).as_numpy("output")

    whole = run(x, parameters={"causal": True})
    steps = [run(x[:, :2], sequence_id=4242, sequence_start=True),
             run(x[:, 2:5], sequence_id=4242),
             run(x[:, 5:], sequence_id=4242, sequence_end=True)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, atol=1e-4)
    expect_error("INVALID_ARGUMENT", lambda: run(x[:, :1], sequence_id=4242))


def test_statistics():
    before = client.get_inference_statistics("sdpa", as_json=True)["model_stats"][0]
    n0 = int(before.get("inference_count", 0))
    client.infer("sdpa", inputs_of(qkv((1, 1, 2, 4))))
    after = client.get_inference_statistics("sdpa", as_json=True)["model_stats"][0]
    assert int(after["inference_count"]) == n0 + 1, (n0, after)
    assert int(after["inference_stats"]["success"]["count"]) >= n0 + 1
    with urllib.request.urlopen(f"http://127.0.0.1:{HTTP_PORT}/v2/models/sdpa/stats") as r:
        http_stats = json.load(r)["model_stats"][0]
    assert int(http_stats["inference_count"]) == n0 + 1
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {"sdpa", "demo"} <= {m["name"] for m in every}


def tls_infer_with_token():
    auth = {"authorization": f"Bearer {TOKEN}"}
    assert client.is_server_live(headers=auth)
    q, k, v = qkv((1, 2, 4, 8))
    r = client.infer("sdpa", inputs_of([q, k, v]), headers=auth)
    np.testing.assert_allclose(r.as_numpy("output"), sdpa_ref(q, k, v), atol=1e-5)


def tls_without_token_is_unauthenticated():
    expect_error("UNAUTHENTICATED", lambda: client.is_server_live())
    e = expect_error("UNAUTHENTICATED",
                     lambda: client.is_server_live(headers={"authorization": "Bearer nope"}))
    assert TOKEN not in e.message()


def tls_plain_client_is_refused():
    plain = grpcclient.InferenceServerClient(f"127.0.0.1:{PORT}")
    expect_error("UNAVAILABLE", lambda: plain.is_server_live(client_timeout=5))
    plain.close()


if TLS_CA:
    for fn in (tls_infer_with_token, tls_without_token_is_unauthenticated,
               tls_plain_client_is_refused):
        check(fn.__name__, fn)
else:
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            check(name[5:], fn)
client.close()
print(f"{results['passed']} passed, {results['failed']} failed")
sys.exit(1 if results["failed"] else 0)
