"""`tensorcheck.VerifyOptions`: a request's options as one type, taken by
every entry point as `options=`, each field also a keyword argument that is
applied over it. An in-process fake server records each request as it
arrived on the wire; no real server is needed."""

from __future__ import annotations

import dataclasses
import pickle
import threading
from collections.abc import Iterator
from typing import Any, Callable

import grpc
import ml_dtypes
import numpy as np
import pytest

import tensorcheck
from in_process_server import serve_in_process
from tensorcheck._model import Capture, check_captures
from tensorcheck._pb import pb, pb_grpc
from test_validation import CASES

# Small enough to travel inline: the fake has no tensor store (its
# FindMissingTensors is UNIMPLEMENTED, so the model checks send their
# weights inline too).
X = np.ones((2, 4), np.float32)
W = np.ones((3, 4), np.float32)
Y = np.full((2, 3), 4.0, np.float32)


class RecordingServer(pb_grpc.TensorCheckServicer):
    """Keeps every Verify, Diagnose and Compare request; answers that the
    output passed and is rounding of cpu:fp32:fused, with the decisions
    about the call at the request's bound_threshold (else
    `default_bound_threshold`, the real server's 3)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Any]] = []
        self.default_bound_threshold = 3.0
        self._lock = threading.Lock()

    def _record(self, method: str, request: Any) -> None:
        with self._lock:
            self.requests.append((method, request))

    def _answer(self, method: str, request: pb.VerifyRequest) -> pb.VerifyResponse:
        self._record(method, request)
        return pb.VerifyResponse(
            verdict=pb.VERDICT_PASS,
            output_shape=[2, 3],
            diagnosis=pb.Diagnosis(
                best="cpu:fp32:fused",
                confidence=1.0,
                verdict=pb.Diagnosis.VERDICT_ROUNDING,
                accepted=bool(request.accept),
            ),
            call=pb.CallDecision(
                explained=True,
                explaining=["cpu:fp32:fused"],
                bound_threshold=(
                    request.bound_threshold.value
                    if request.HasField("bound_threshold")
                    else self.default_bound_threshold
                ),
            ),
        )

    def Verify(self, request: pb.VerifyRequest, context: grpc.ServicerContext) -> object:
        return self._answer("Verify", request)

    def Diagnose(self, request: pb.VerifyRequest, context: grpc.ServicerContext) -> object:
        return self._answer("Diagnose", request)

    def Compare(self, request: pb.CompareRequest, context: grpc.ServicerContext) -> object:
        self._record("Compare", request)
        return pb.CompareResponse(headline="A sentence of the server's.")


@pytest.fixture
def recorded() -> Iterator[tuple[RecordingServer, str, tensorcheck.Client]]:
    servicer = RecordingServer()
    with serve_in_process(servicer, workers=4) as target:
        with tensorcheck.Client(target, timeout=30) as client:
            yield servicer, target, client


def _torch_model() -> tuple[Any, Any]:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import tensorcheck.torch  # noqa: F401  (check_linears)

    torch.manual_seed(0)
    return torch.nn.Linear(4, 3), torch.ones(2, 4)


def _check_linears(client: tensorcheck.Client, **kw: Any) -> None:
    model, x = _torch_model()
    tensorcheck.torch.check_linears(model, x, client=client, progress=False, **kw)


def _assert_model_parity(client: tensorcheck.Client, **kw: Any) -> None:
    model, x = _torch_model()
    tensorcheck.assert_model_parity(model, x, client=client, progress=False, **kw)


def _check_denses(client: tensorcheck.Client, **kw: Any) -> None:
    pytest.importorskip("flax", reason="flax is not installed")
    import flax.linen as fnn
    import jax

    import tensorcheck.flax

    module = fnn.Dense(3)
    variables = module.init(jax.random.PRNGKey(0), X)
    tensorcheck.flax.check_denses(module, variables, X, client=client, progress=False, **kw)


def _check_captures(client: tensorcheck.Client, **kw: Any) -> None:
    check_captures([Capture("fc", 0, X, W, None, Y)], client=client, progress=False, **kw)


# Each entry point as (target, client, **keywords) -> None.
Call = Callable[..., None]
ENTRY_POINTS: dict[str, Call] = {
    "Client.verify_linear": lambda t, c, **kw: c.verify_linear(X, W, observed=Y, **kw),
    "Client.diagnose_linear": lambda t, c, **kw: c.diagnose_linear(X, W, observed=Y, **kw),
    "Client.assert_linear_parity": (
        lambda t, c, **kw: c.assert_linear_parity(X, W, observed=Y, **kw)
    ),
    "Client.compare_outputs": (
        lambda t, c, **kw: c.compare_outputs(X, W, None, {"a": Y, "b": Y}, **kw)
    ),
    "tensorcheck.assert_linear_parity": (
        lambda t, c, **kw: tensorcheck.assert_linear_parity(X, W, observed=Y, server=t, **kw)
    ),
    "tensorcheck.compare_outputs": (
        lambda t, c, **kw: tensorcheck.compare_outputs(X, W, None, {"a": Y, "b": Y}, server=t, **kw)
    ),
    "check_captures": lambda t, c, **kw: _check_captures(c, **kw),
    "tensorcheck.torch.check_linears": lambda t, c, **kw: _check_linears(c, **kw),
    "tensorcheck.flax.check_denses": lambda t, c, **kw: _check_denses(c, **kw),
    "tensorcheck.assert_model_parity": lambda t, c, **kw: _assert_model_parity(c, **kw),
}
# Where a call's keyword arguments are the model's: the options' fields go
# in verify_options= (configs, tolerance and timeout have names of their own).
MODEL_KEYWORDS = {
    "tensorcheck.torch.check_linears",
    "tensorcheck.flax.check_denses",
    "tensorcheck.assert_model_parity",
}

OPTIONS = tensorcheck.VerifyOptions(
    configs=["cpu:fp32", "cpu:tf32"], reference="cpu:fp64", activation="relu", top_k=7
)


def _fields(req: Any) -> tuple[list[str], str, int, int]:
    """What OPTIONS set, as a Verify, Diagnose or Compare request carries it."""
    return list(req.configs), req.reference, req.op.activation, req.output.top_k


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_takes_options(recorded, entry):
    servicer, target, client = recorded
    ENTRY_POINTS[entry](target, client, options=OPTIONS)
    assert servicer.requests
    for _, req in servicer.requests:
        assert _fields(req) == (["cpu:fp32", "cpu:tf32"], "cpu:fp64", pb.ACTIVATION_RELU, 7)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_keyword_argument_wins_over_the_options(recorded, entry):
    servicer, target, client = recorded
    ENTRY_POINTS[entry](target, client, options=OPTIONS, configs=["cpu:bf16:fused"])
    assert servicer.requests
    for _, req in servicer.requests:
        assert _fields(req) == (["cpu:bf16:fused"], "cpu:fp64", pb.ACTIVATION_RELU, 7)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_option_of_verify_options_wins_over_the_options(recorded, entry):
    servicer, target, client = recorded
    more = {"top_k": 3, "reference": "cpu:fp32"}
    if entry in MODEL_KEYWORDS:
        ENTRY_POINTS[entry](target, client, options=OPTIONS, verify_options=more)
    else:
        ENTRY_POINTS[entry](target, client, options=OPTIONS, **more)
    assert servicer.requests
    for _, req in servicer.requests:
        assert _fields(req) == (["cpu:fp32", "cpu:tf32"], "cpu:fp32", pb.ACTIVATION_RELU, 3)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_unknown_option_is_a_type_error_naming_it(recorded, entry):
    servicer, target, client = recorded
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['tolerence'\]"):
        if entry in MODEL_KEYWORDS:
            ENTRY_POINTS[entry](target, client, verify_options={"tolerence": "numpy"})
        else:
            ENTRY_POINTS[entry](target, client, tolerence="numpy")
    assert servicer.requests == []


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_bad_value_is_an_error_naming_the_field(recorded, entry):
    servicer, target, client = recorded
    with pytest.raises(ValueError, match=r"^top_k: expected a non-negative value, got -1$"):
        if entry in MODEL_KEYWORDS:
            ENTRY_POINTS[entry](target, client, verify_options={"top_k": -1})
        else:
            ENTRY_POINTS[entry](target, client, top_k=-1)
    with pytest.raises(ValueError, match=r"^configs\[1\]: 'cpu::fused' is not of the form"):
        ENTRY_POINTS[entry](target, client, configs=["cpu:fp32", "cpu::fused"])
    assert servicer.requests == []


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_options_that_are_not_verify_options_are_a_type_error(recorded, entry):
    servicer, target, client = recorded
    with pytest.raises(
        TypeError, match=r"^options: expected a tensorcheck.VerifyOptions, got dict"
    ):
        ENTRY_POINTS[entry](target, client, options={"top_k": 3})
    assert servicer.requests == []


# test_validation's cases whose every argument is an option: the messages
# the keyword arguments have always raised.
OPTION_CASES = [
    case
    for case in CASES
    if set(case[0]) <= {f.name for f in dataclasses.fields(tensorcheck.VerifyOptions)}
]


@pytest.mark.parametrize(
    "kwargs, exc, pattern", OPTION_CASES, ids=[next(iter(c[0])) for c in OPTION_CASES]
)
def test_making_options_raises_what_the_keyword_raises(offline_client, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern) as made:
        tensorcheck.VerifyOptions(**kwargs)
    with pytest.raises(exc, match=pattern) as called:
        offline_client.verify_linear(X, W, observed=Y, **kwargs)
    assert str(made.value) == str(called.value)


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(timeout=-1), ValueError, r"^timeout: expected a non-negative value"),
        (dict(progress="yes"), TypeError, r"^progress: expected None, a bool or a callable"),
        (dict(accept=["cpu:"]), ValueError, r"^accept\[0\]: 'cpu:' is not of the form"),
        (dict(batch_sizes=[2]), ValueError, r"^batch_sizes: only with batch_invariance=True"),
        (dict(bound_factor=0), ValueError, r"^bound_factor: expected a positive number"),
        (dict(algorithm_sweep=True), TypeError, r"^algorithm_sweep: expected a non-negative"),
        (dict(x_scale="1"), TypeError, r"^x_scale: expected real numbers"),
        (dict(w_scale=float("nan")), ValueError, r"^w_scale: a finite, positive float32 scale"),
    ],
)
def test_every_field_is_checked_when_the_options_are_made(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        tensorcheck.VerifyOptions(**kwargs)


def test_options_are_frozen_and_replace_checks_the_new_value():
    opts = tensorcheck.VerifyOptions(top_k=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.top_k = 6  # type: ignore[misc]
    assert dataclasses.replace(opts, top_groups=2) == tensorcheck.VerifyOptions(
        top_k=5, top_groups=2
    )
    with pytest.raises(ValueError, match="^top_groups: "):
        dataclasses.replace(opts, top_groups=-2)
    assert tensorcheck.VerifyOptions() == tensorcheck.VerifyOptions()


def test_a_layer_is_judged_by_torch_and_a_model_by_bound_unless_the_options_say(recorded):
    servicer, target, client = recorded
    client.verify_linear(X, W, observed=Y)
    _check_captures(client)
    _check_captures(client, options=tensorcheck.VerifyOptions(tolerance="torch"))
    _check_captures(
        client, options=tensorcheck.VerifyOptions(tolerance="torch"), tolerance="ulp", max_ulp=2
    )
    assert [req.tolerance.preset for _, req in servicer.requests] == [
        pb.Tolerance.PRESET_TORCH,
        pb.Tolerance.PRESET_BOUND,
        pb.Tolerance.PRESET_TORCH,
        pb.Tolerance.PRESET_ULP,
    ]


def test_a_model_check_takes_each_layout_from_its_capture(recorded):
    servicer, target, client = recorded
    kernel = np.ascontiguousarray(W.T)  # [K, N]
    check_captures(
        [Capture("dense", 0, X, kernel, None, Y, weight_layout="in_out")],
        client=client,
        progress=False,
        options=tensorcheck.VerifyOptions(weight_layout="out_in", progress=True),
    )
    assert [req.op.weight_layout for _, req in servicer.requests] == [pb.WEIGHT_LAYOUT_IN_OUT]
    with pytest.raises(TypeError, match="^weight_layout: a model check takes"):
        _check_captures(client, weight_layout="in_out")


def test_a_model_option_given_twice_is_a_type_error(recorded):
    servicer, target, client = recorded
    with pytest.raises(TypeError, match="multiple values for keyword argument 'configs'"):
        _check_linears(client, configs=["cpu:fp32"], verify_options={"configs": ["cpu:tf32"]})
    with pytest.raises(TypeError, match="multiple values for keyword argument 'bound_threshold'"):
        _check_linears(client, bound_threshold=4, verify_options={"bound_threshold": 5})
    assert servicer.requests == []


@pytest.mark.parametrize(
    "value, exc, pattern",
    [
        (0, ValueError, r"^bound_threshold: expected a positive number, got 0$"),
        (-1.5, ValueError, r"^bound_threshold: expected a positive number, got -1.5$"),
        (float("inf"), ValueError, r"^bound_threshold: expected a finite number, got inf$"),
        (float("nan"), ValueError, r"^bound_threshold: expected a finite number, got nan$"),
        ("3", TypeError, r"^bound_threshold: expected a positive number, got str$"),
        (True, TypeError, r"^bound_threshold: expected a positive number, got bool$"),
    ],
)
def test_bound_threshold_is_a_positive_finite_number(recorded, value, exc, pattern):
    servicer, target, client = recorded
    with pytest.raises(exc, match=pattern):
        tensorcheck.VerifyOptions(bound_threshold=value)
    with pytest.raises(exc, match=pattern):
        _check_captures(client, bound_threshold=value)
    assert servicer.requests == []


def test_a_model_check_sends_its_bound_threshold_and_reports_the_one_applied(recorded):
    servicer, target, client = recorded
    servicer.default_bound_threshold = 2.5  # a server whose default is not 3
    caps = [Capture("fc", 0, X, W, None, Y)]
    opts = tensorcheck.VerifyOptions(bound_threshold=4)
    reports = [
        check_captures(caps, client=client, progress=False),
        check_captures(caps, client=client, progress=False, bound_threshold=5),
        check_captures(caps, client=client, progress=False, options=opts),
        # A keyword wins over the options.
        check_captures(caps, client=client, progress=False, options=opts, bound_threshold=6),
    ]
    requests = [req for _, req in servicer.requests]
    assert [req.HasField("bound_threshold") for req in requests] == [False, True, True, True]
    assert [req.bound_threshold.value for req in requests[1:]] == [5, 4, 6]
    # The report records the threshold sent (None: none) and, applied, the
    # server's own where none was.
    assert [r.bound_threshold for r in reports] == [None, 5, 4, 6]
    assert [r.applied_bound_threshold for r in reports] == [2.5, 5, 4, 6]
    assert [r.to_dict()["bound_threshold"] for r in reports] == [None, 5, 4, 6]
    assert all(r.passed for r in reports)
    # A single layer's request carries it too; Report.call says what applied.
    report = client.verify_linear(X, W, observed=Y, bound_threshold=7)
    assert servicer.requests[-1][1].bound_threshold.value == 7
    assert report.call is not None and report.call.bound_threshold == 7


def test_gpu_is_sent_as_given_by_every_layer_request_and_unset_without_it(recorded):
    servicer, target, client = recorded
    client.verify_linear(X, W, observed=Y, accept="fp32", gpu="H100")
    client.diagnose_linear(X, W, observed=Y, gpu="sm90")
    client.diagnose_linear(X, W, observed=Y, options=tensorcheck.VerifyOptions(gpu="b200"))
    # The server judges the name: an unknown one travels too.
    client.diagnose_linear(X, W, observed=Y, gpu="tpu")
    client.diagnose_linear(X, W, observed=Y)
    _check_captures(client, gpu="a100")
    assert [(method, req.gpu) for method, req in servicer.requests] == [
        ("Verify", "H100"),
        ("Diagnose", "sm90"),
        ("Diagnose", "b200"),
        ("Diagnose", "tpu"),
        ("Diagnose", ""),
        ("Diagnose", "a100"),
    ]
    # The Compare RPC has no place for it.
    with pytest.raises(
        TypeError, match=r"compare_outputs\(\) got unexpected keyword arguments \['gpu'\]"
    ):
        client.compare_outputs(X, W, None, {"a": Y, "b": Y}, gpu="h100")


@pytest.mark.parametrize(
    "value, exc, pattern",
    [
        ("", ValueError, r"^gpu: expected a GPU \(a100, h100"),
        ("  ", ValueError, r"^gpu: expected a GPU"),
        (90, TypeError, r"^gpu: expected a GPU name such as 'h100' or 'sm90', got int$"),
        (b"h100", TypeError, r"^gpu: expected a GPU name .*, got bytes$"),
    ],
)
def test_gpu_is_a_non_empty_string(recorded, value, exc, pattern):
    servicer, target, client = recorded
    with pytest.raises(exc, match=pattern):
        tensorcheck.VerifyOptions(gpu=value)
    with pytest.raises(exc, match=pattern):
        client.diagnose_linear(X, W, observed=Y, gpu=value)
    assert servicer.requests == []


def test_compare_outputs_ignores_the_options_compare_has_no_place_for(recorded):
    servicer, target, client = recorded
    opts = tensorcheck.VerifyOptions(tolerance="bound", repeat=2, top_k=4)
    client.compare_outputs(X, W, None, {"a": Y, "b": Y}, options=opts)
    assert [req.output.top_k for _, req in servicer.requests] == [4]
    with pytest.raises(
        TypeError, match=r"compare_outputs\(\) got unexpected keyword arguments \['repeat'\]"
    ):
        client.compare_outputs(X, W, None, {"a": Y, "b": Y}, repeat=2)


def test_candidates_and_the_options_configs_are_one_list(recorded):
    servicer, target, client = recorded
    with pytest.raises(TypeError, match="^candidates: give either candidates= or configs="):
        client.diagnose_linear(X, W, observed=Y, candidates=["cpu:fp32"], options=OPTIONS)
    client.diagnose_linear(X, W, observed=Y, candidates="cpu:bf16")
    assert [list(req.configs) for _, req in servicer.requests] == [["cpu:bf16"]]


def test_one_options_object_serves_many_calls(recorded):
    servicer, target, client = recorded
    opts = tensorcheck.VerifyOptions(accept=["tf32"], top_groups=3)
    client.verify_linear(X, W, observed=Y, options=opts)
    client.diagnose_linear(X, W, observed=Y, options=opts)
    tensorcheck.assert_linear_parity(X, W, observed=Y, server=target, options=opts)
    assert [(m, list(req.accept), req.output.top_groups) for m, req in servicer.requests] == [
        ("Verify", ["tf32"], 3),
        ("Diagnose", ["tf32"], 3),
        ("Verify", ["tf32"], 3),
    ]


def test_the_options_keep_sequences_as_tuples_and_read_an_iterator_once(recorded):
    servicer, target, client = recorded
    opts = tensorcheck.VerifyOptions(configs=iter(["cpu:fp32", "cpu:tf32"]), accept=["tf32"])
    assert (opts.configs, opts.accept) == (("cpu:fp32", "cpu:tf32"), ("tf32",))
    client.verify_linear(X, W, observed=Y, options=opts)
    client.verify_linear(X, W, observed=Y, options=opts)
    assert [list(req.configs) for _, req in servicer.requests] == [["cpu:fp32", "cpu:tf32"]] * 2
    assert pickle.loads(pickle.dumps(opts)) == opts
    assert hash(opts) == hash(dataclasses.replace(opts, configs=["cpu:fp32", "cpu:tf32"]))


def test_a_scale_is_read_at_each_request(offline_client):
    x8 = X.astype(ml_dtypes.float8_e4m3fn)
    w8 = W.astype(ml_dtypes.float8_e4m3fn)
    scale = np.array([0.5], np.float32)
    opts = tensorcheck.VerifyOptions(x_scale=scale, w_scale=1.0)
    first = offline_client._request(x8, w8, None, observed=None, options=opts)
    scale[0] = 2.0  # a scale updated in place, as FP8 recipes do
    second = offline_client._request(x8, w8, None, observed=None, options=opts)
    sent = [np.frombuffer(c.request.op.input_scale.data, "<f4").tolist() for c in (first, second)]
    assert sent == [[0.5], [2.0]]
