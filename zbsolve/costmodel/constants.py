"""The cost model's constants, each defined once as a record (``Constant``: value, unit, source, description) in
``CONSTANTS`` and bound to a module-level name that the cost model reads (``WEIGHT_BYTES``, ``P2P_LATENCY``, ...).

A source is a datasheet, a paper, a runtime's source file with its version, or a measurement file under
``problems/measured/``; an assumption says so. Per-GPU figures (peaks, bandwidths, memory, SMs) stay in the presets
of ``zbsolve.costmodel.gpus``, and the measured kernel tables are read by ``zbsolve.costmodel.measured``.
``docs/cost-model.md`` holds ``table()``, the table of these records (``tests/test_constants.py`` checks both
ways).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from zbsolve.base.units import GIB
from zbsolve.core.overlap import OVERLAP_SAVING as _OVERLAP_SAVING
from zbsolve.core.overlap import OVERLAP_SLOWDOWN as _OVERLAP_SLOWDOWN

T = TypeVar("T")


@dataclass(frozen=True)
class Constant:
    """One constant of the cost model."""

    name: str
    """The module-level name it is bound to."""
    value: Any
    """Its value, in ``unit``."""
    unit: str
    """What the value counts."""
    source: str
    """Where it comes from."""
    description: str
    """What the cost model uses it for."""


CONSTANTS: dict[str, Constant] = {}
"""Every constant of the cost model by name, in the order defined."""
H100_GRID = "problems/measured/h100/kernels.json (605 BF16 and 605 FP8 shapes)"
"""The measurement the kernel model's fitted constants come from."""


def _define(name: str, value: T, unit: str, source: str, description: str) -> T:
    """Record the constant ``name`` in ``CONSTANTS`` and return its value."""
    CONSTANTS[name] = Constant(name, value, unit, source, description)
    return value


FP32_BYTES = _define("FP32_BYTES", 4, "bytes/element", "IEEE 754 binary32",
                     "an fp32 element: gradient accumulators, the loss's log-probabilities and the loss, a router's "
                     "probabilities and top-k weights")
ID_BYTES = _define("ID_BYTES", 8, "bytes/token", "torch int64 token ids",
                   "a token id, which the embedding keeps for its weight gradient")
DTYPE_BYTES = _define("DTYPE_BYTES", {"bf16": 2, "fp16": 2, "fp8": 2}, "bytes/element",
                      "Transformer Engine casts a linear layer's input and weight to FP8 inside it",
                      "weights and activations by dtype (under FP8 both stay BF16 between kernels)")
LOSS_GRAD_COPIES = _define("LOSS_GRAD_COPIES", {"megatron": 0, "torchtitan": 2}, "fp32 copies of the logits",
                           "torchtitan 9dec370 train.py loss_fn: cross_entropy(pred.float()) in eager (not fused); "
                           "torch's nll_loss_backward and _log_softmax_backward_data each write a new tensor. "
                           "Megatron: LOSS_KEPT_BYTES's fused loss writes the gradient in place",
                           "what the loss's backward holds at once beside what F kept, by runtime: under torchtitan "
                           "the log-probabilities' gradient and the logits' gradient, both fp32, before the cast "
                           "back to 16 bits; under Megatron none")
LOSS_KEPT_BYTES = _define("LOSS_KEPT_BYTES", {"megatron": 2, "torchtitan": FP32_BYTES}, "bytes/logit",
                          "Megatron-Bridge v0.2.0 gpt_provider.py (cross_entropy_loss_fusion=True) and "
                          "scripts/performance/utils/helpers.py set_common_perf_overrides "
                          "(cross_entropy_fusion_impl='te'); megatron-core 0.16.1 language_module.py "
                          "compute_language_model_loss; Transformer Engine 2.9 pytorch/cross_entropy.py "
                          "CrossEntropyFunction (triton/cross_entropy.py writes the gradient into the input); "
                          "torchtitan 9dec370 train.py loss_fn",
                          "what the loss keeps of each logit from F to B, by runtime: under Megatron the 16-bit "
                          "logits, into which Transformer Engine's fused cross entropy writes their gradient in F "
                          "(B scales them in place); under torchtitan the fp32 log-probabilities")
COMBINE_KEPT_COPIES = _define("COMBINE_KEPT_COPIES", {"megatron": 0, "torchtitan": 1}, "k·h-wide copies a token",
                              "megatron-core 0.16.1 transformer/moe/experts.py TEGroupedMLP.forward "
                              "(weighted_bias_swiglu_impl takes permuted_probs), token_dispatcher.py "
                              "MoEAlltoAllTokenDispatcher.combine_postprocess (unpermute without probs); torchtitan "
                              "0.3.0 models/common/token_dispatcher.py LocalTokenDispatcher.combine (scores times "
                              "the experts' outputs)",
                              "the routed experts' outputs F keeps for the router's weights, by runtime: Megatron "
                              "weighs the copies inside the experts' activation function (whose input it keeps "
                              "anyway) and its combine keeps nothing; torchtitan weighs the experts' outputs before "
                              "the combine and keeps them")
FP8_WEIGHT_BYTES = _define("FP8_WEIGHT_BYTES", 2, "bytes/parameter",
                           "Transformer Engine's cached FP8 weight and its transpose (Hopper's FP8 products take one "
                           "operand layout)",
                           "what a parameter of an FP8 product adds under dtype fp8 (its scaling state left out)")
WEIGHT_BYTES = _define("WEIGHT_BYTES", 2, "bytes/parameter", "ZeRO (Rajbhandari et al. 2020), section 3.1",
                       "mixed-precision Adam: the 16-bit weight")
GRAD_BYTES = _define("GRAD_BYTES", 2, "bytes/parameter", "ZeRO (Rajbhandari et al. 2020), section 3.1",
                     "mixed-precision Adam: the 16-bit gradient")
OPTIMIZER_BYTES = _define("OPTIMIZER_BYTES", 12, "bytes/parameter", "ZeRO (Rajbhandari et al. 2020), section 3.1",
                          "mixed-precision Adam: fp32 master weight, momentum and variance")
OPTIMIZER_STEP_BYTES = _define("OPTIMIZER_STEP_BYTES", 2 * OPTIMIZER_BYTES + GRAD_BYTES + WEIGHT_BYTES,
                               "bytes/parameter", "apex's and Transformer Engine's fused multi-tensor Adam",
                               "HBM bytes the optimizer step moves a parameter of its shard: reads and writes its "
                               "fp32 states, reads its gradient, writes its weight")
BUCKET_PARAMS = _define("BUCKET_PARAMS", (40_000_000, 1_000_000), "parameters",
                        "megatron-core 0.16.1, distributed_data_parallel.py: max(40000000, 1000000 * dp)",
                        "a gradient-reduction bucket: the larger of the first and the second times the replicas")
FSDP_LIVE_LAYERS = _define("FSDP_LIVE_LAYERS", 2, "layers",
                           "torch FSDP2's implicit prefetching; Megatron FSDP's prefetch of the next bucket",
                           "layers whose gathered parameters a device holds at once under FSDP: the one computing "
                           "and the next")
FSDP_PIPELINED = _define("FSDP_PIPELINED", True, "flag",
                         "torchtitan 9dec370 parallelize_llama.py apply_fsdp: reshard_after_forward=False when "
                         "pp_enabled; torch 2.6 torch/distributed/pipelining/stage.py backward_maybe_with_nosync: "
                         "FSDP reshards after backward and reduce-scatters only on the last microbatch",
                         "under FSDP with pipeline parallelism a device holds every layer of its stages gathered "
                         "(16-bit weight and gradient) for the whole step, not FSDP_LIVE_LAYERS of them")
FSDP_REDUCE_BYTES = _define("FSDP_REDUCE_BYTES", {"megatron": GRAD_BYTES, "torchtitan": 4}, "bytes/parameter",
                            "torchtitan 9dec370 config_manager.py: training.mixed_precision_reduce float32 "
                            "(MixedPrecisionPolicy reduce_dtype); torch 2.13 fsdp/_fully_shard/_fsdp_param.py "
                            "to_accumulated_grad_if_needed, _fsdp_collectives.py foreach_reduce",
                            "a gathered layer's gradient under FSDP by runtime: torchtitan's FSDP2 holds it in its "
                            "reduce dtype (fp32: the accumulator between a pipeline's microbatches, else the "
                            "reduce-scatter's input); Megatron's in the 16-bit gradient")
FP8_GATHER_BYTES = _define("FP8_GATHER_BYTES", 1, "bytes/parameter",
                           "torchao eab345c float8/fsdp_utils.py WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather "
                           "(torchtitan float8.enable_fsdp_float8_all_gather)",
                           "under torchtitan with dtype fp8 and FSDP, a gathered parameter of an FP8 product: the "
                           "weight all-gathered and kept in FP8; torchao keeps no FP8 copy beside the sharded weight")
PP_RECV_BUFFERS = _define("PP_RECV_BUFFERS", 1, "buffers per microbatch and direction",
                          "torch 2.13 distributed/pipelining/stage.py PipelineStage._setup_forward_recv_info, "
                          "_create_grad_recv_info: a receive buffer allocated per microbatch at the first step",
                          "under torchtitan (torch.distributed.pipelining) a stage holds, for the whole step, one "
                          "buffer per microbatch for the activation it receives (not the first stage) and one for "
                          "the gradient it receives (not the last)")
PP_OUTPUT_CHUNKS = _define("PP_OUTPUT_CHUNKS", 1, "outputs per microbatch",
                           "torch 2.13 distributed/pipelining/stage.py forward_one_chunk (output_chunks) with the "
                           "schedules' step(return_outputs=True) default, as torchtitan 9dec370 calls it",
                           "under torchtitan the last stage keeps each microbatch's output (its 16-bit logits) "
                           "until the step ends")
CUDA_CONTEXT = _define("CUDA_CONTEXT", 512 * 2**20, "bytes",
                       "an assumption: PyTorch's CUDA semantics notes (memory management) leave the CUDA context "
                       "and the libraries' workspaces outside the caching allocator's statistics; CUDA 12's lazy "
                       "loading keeps the context near 0.5 GiB on Hopper",
                       "a device's CUDA context and library handles, outside torch's allocator")
NCCL_BUFFSIZE = _define("NCCL_BUFFSIZE", 4 * 2**20, "bytes",
                        "NCCL 2.x documentation, environment variables: NCCL_BUFFSIZE default 4194304",
                        "the buffer NCCL allocates per channel and peer of a communicator")
NCCL_CHANNELS = _define("NCCL_CHANNELS", 32, "channels", "NCCL 2.x src/include/device.h MAXCHANNELS (an upper bound)",
                        "channels of a communicator")
NCCL_PEERS = _define("NCCL_PEERS", 2, "peers", "NCCL's ring algorithms and the pipeline's point-to-point: the "
                     "previous and the next rank", "peers a rank of a communicator keeps buffers for")
ALLOCATOR_FRAGMENTATION = _define("ALLOCATOR_FRAGMENTATION", 0.0, "share of the allocator's bytes",
                                  "an assumption: torchtitan 9dec370 run_llama_train.sh sets "
                                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place); no "
                                  "published measurement states more",
                                  "what torch's caching allocator reserves beyond the bytes it hands out")
DEFAULT_RESERVE = _define("DEFAULT_RESERVE", 4 * GIB, "bytes", "an assumption",
                          "kept free on every device by zbsolve plan (predict and configure count the runtime's "
                          "terms instead: costmodel.runtime_memory)")
NCCL = "NCCL 2.27.7 src/graph/tuning.cc"
"""The runtime source NCCL's tuning model (``zbsolve.costmodel.nccl``) is read from."""
NCCL_PROTOCOLS = ("LL", "LL128", "Simple")
"""NCCL's protocols, in its tables' order."""
NCCL_BASE_LATENCY = _define("NCCL_BASE_LATENCY", {"LL": 6.6e-6, "LL128": 14.0e-6, "Simple": 8.4e-6}, "s",
                            NCCL + " baseLat (Ring)",
                            "what a ring collective takes by protocol before its steps (``nccl.ring``)")
NCCL_NVLINK_HOP = _define("NCCL_NVLINK_HOP", {"LL": 0.6e-6, "LL128": 1.9e-6, "Simple": 3.4e-6}, "s",
                          NCCL + " hwLat[NVLINK] (Ring)", "latency a ring step within a node adds, by protocol")
NCCL_NETWORK_HOP = _define("NCCL_NETWORK_HOP", {"LL": 2.7e-6, "LL128": 4.0e-6, "Simple": 14.0e-6}, "s",
                           NCCL + " hwLat[NET] (Ring; latencyInter 0, as NCCL's IB transport reports it)",
                           "latency a ring step between nodes adds, by protocol, where a node holds more than one "
                           "rank of the group")
NCCL_NETWORK_HOP_ALONE = _define("NCCL_NETWORK_HOP_ALONE", {"LL": 5.0e-6, "LL128": 8.5e-6, "Simple": 14.0e-6}, "s",
                                 NCCL + " hwLat[NET] (Tree), which the ring takes with one rank per node",
                                 "latency a ring step between nodes adds where a node holds one rank of the group")
NCCL_NET_OVERHEAD = _define("NCCL_NET_OVERHEAD", {"LL": 1.0e-6, "LL128": 1.0e-6, "Simple": 3.0e-6}, "s",
                            NCCL + " getNetOverhead (1 us on x86, 3x under Simple)",
                            "the least a ring step within a node adds where the ring spans nodes")
NCCL_PROTOCOL_SHARE = _define("NCCL_PROTOCOL_SHARE", {"LL": 0.5, "LL128": 0.92, "Simple": 1.0},
                              "share of the bus bandwidth", NCCL + " ncclTopoTuneModel (Ring LL: x 0.5; "
                              "LL128: x 0.92, x 0.7 with one rank per node)",
                              "bandwidth each protocol reaches; NCCL picks the protocol of the least time, so small "
                              "messages go latency-bound at LL's and large ones at Simple's bandwidth")
NCCL_LL128_ALONE = _define("NCCL_LL128_ALONE", 0.7, "share of the bus bandwidth", NCCL + " ncclTopoTuneModel",
                           "LL128's share where a node holds one rank of the group")
NCCL_RING_PLATEAU = _define("NCCL_RING_PLATEAU", 1.4, "times the latency", NCCL + " ncclTopoGetAlgoTime",
                            "a ring all-reduce's Simple latency across nodes (from compute capability 8.0)")
NCCL_NVLINK_SHARE = _define("NCCL_NVLINK_SHARE", 20.6 / 25, "share of the NVLink bandwidth",
                            "NCCL 2.27.7 src/graph/topo.h SM90_NVLINK_BW 20.6 GB/s of NVLink 4's 25 GB/s per link "
                            "and direction (SM80 20 of 25, SM100 40.1 of 50: 0.80)",
                            "what NCCL drives NVLink at: every transfer and collective within a node")
P2P_LATENCY = _define("P2P_LATENCY", {"nvlink": NCCL_BASE_LATENCY["Simple"] + NCCL_NVLINK_HOP["Simple"],
                                      "network": NCCL_BASE_LATENCY["Simple"] + NCCL_NETWORK_HOP["Simple"]}, "s",
                      NCCL + ": one Simple ring step, baseLat + hwLat (NCCL's point-to-point sends take the Simple "
                      "protocol and its model gives them no table of their own)",
                      "added to every point-to-point transfer by link: a stage's send, a context-parallel ring "
                      "step, an expert all-to-all")
ROUTING_DRAW = _define("ROUTING_DRAW", 1.0, "variance over mean of a device's received copies",
                       "a binomial draw: each copy lands on one of ep devices with probability 1/ep (megatron-core "
                       "0.16 router.py: moe_router_force_load_balancing draws random logits), variance c(1 - 1/ep) "
                       "of mean c; the busiest of ep at the expected maximum of ep Gaussian draws (Blom 1958)",
                       "the busiest expert-parallel device's load, on which the routed experts' products are timed "
                       "(``routing.busiest``): the least imbalance routing balanced in expectation leaves")
KERNEL_LAUNCH = _define("KERNEL_LAUNCH", 5e-6, "s",
                        "CUDA's launch path through the driver, 4-6 microseconds a kernel (pegainfer, From Launch "
                        "Overhead to CUDA Graph, 2025; NVIDIA Technical Blog, Getting Started with CUDA Graphs, 2019: "
                        "2.9-microsecond kernels take 9.6 apiece with the host waiting between them)",
                        "host seconds to launch one kernel: a pass runs no faster than its kernels' launches "
                        "(``Timing.seconds``), which bites where a pass's kernels are many and small (a device's "
                        "per-expert products, the dropless dispatcher's host synchronisation every layer)")
KERNEL_GAP = _define("KERNEL_GAP", 0.9e-6, "s",
                     "NVIDIA Technical Blog, Getting Started with CUDA Graphs (2019): 2.9-microsecond kernels "
                     "launched back to back on one stream take 3.8 apiece",
                     "device seconds between two kernels of a stream launched ahead of it: added per kernel a pass "
                     "launches")
GPUS_PER_NODE = _define("GPUS_PER_NODE", 8, "GPUs", "NVIDIA DGX/HGX nodes",
                        "GPUs an NVLink domain joins, unless a preset says otherwise")
GEMM_FRACTION = _define("GEMM_FRACTION", 0.753, "share of the BF16 peak", H100_GRID,
                        "what a BF16 product reaches with full waves and a deep inner size: the rate whose model "
                        "gives the measured median of the shapes of at least 4096 each way")
FP8_GEMM_FRACTION = _define("FP8_GEMM_FRACTION", 0.685, "share of the FP8 peak", H100_GRID,
                            "what an FP8 product reaches so (torch._scaled_mm, tensor-wise scales)")
TILE = _define("TILE", (128, 128), "rows, columns",
               "CUTLASS 3's SM90 warp-specialized BF16/FP8 kernels; " + H100_GRID,
               "the output tile of one thread block of a matrix product (fits the grid better than 128 x 256)")
SPLIT_K_DEPTH = _define("SPLIT_K_DEPTH", 2048, "elements", "fitted to " + H100_GRID + " among 1024, 2048 and none",
                        "the least inner size of a split of a split-K product (cuBLAS splits k where tiles leave "
                        "SMs idle)")
K_HALF_BYTES = _define("K_HALF_BYTES", 256, "bytes", "fitted to " + H100_GRID + " among 64-384 elements",
                       "the inner size at which a product reaches half its full-depth rate")
ATTENTION_REFERENCE = _define("ATTENTION_REFERENCE", 128, "head size",
                              "problems/measured/<gpu>/kernels.json, attention",
                              "the head size whose sequences the attention table spans; others scale its rate by "
                              "their ratio at 4096")
ATTENTION_B_FLOPS = _define("ATTENTION_B_FLOPS", 2.5, "times F's FLOPs",
                            "FlashAttention-2 (Dao 2023): the backward recomputes the scores, 5 products against F's 2",
                            "what flash attention's B counts at its measured rate")
STREAMING_KERNEL = _define("STREAMING_KERNEL", "residual_add", "kernel",
                           "problems/measured/<gpu>/kernels.json, memory_bound",
                           "the measured kernel whose share of the datasheet HBM bandwidth (2 decimals) every "
                           "memory-bound kernel streams at: fused kernels taken at an eager residual add's rate")
COMPUTE_INTERFERENCE = _define("COMPUTE_INTERFERENCE", 0.189, "s/s",
                                "Lee et al. 2025, Characterizing compute-communication overlap in GPU-accelerated "
                                "distributed deep learning (arXiv 2507.03114): 18.9% average, 40% at most",
                                "computation lost per second a collective overlaps it (tensor-parallel overlap, "
                                "FSDP's transfers, the overlapped data-parallel synchronisation): the default of "
                                "every GPU preset's ``Gpu.compute_interference``")
COLLECTIVE_INTERFERENCE = _define("COLLECTIVE_INTERFERENCE", 0.30, "s/s",
                                  "vTrain (Bang et al., MICRO 2024): NCCL's collectives run about 30% slower inside "
                                  "training than profiled alone",
                                  "what a collective overlapping computation takes longer than alone: the default "
                                  "of every GPU preset's ``Gpu.collective_interference``")
OVERLAP_SLOWDOWN = _define("OVERLAP_SLOWDOWN", _OVERLAP_SLOWDOWN, "s/s",
                           "DeepSeek-V3 technical report: 20 of an H800's 132 SMs run communication",
                           "computation lost per second of communication beside it in an overlapped F&B pair "
                           "(defined in zbsolve.core.overlap, below the cost model)")
OVERLAP_SAVING = _define("OVERLAP_SAVING", _OVERLAP_SAVING, "share", "an assumption",
                         "share of an overlapped pair's computation saved by running its two chunks together "
                         "(defined in zbsolve.core.overlap)")


def shown(value: object) -> str:
    """A constant's value as the docs' table writes it."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, tuple):
        return " x ".join(map(str, value)) if all(isinstance(v, int) and v < 10_000 for v in value) else \
            ", ".join(f"{v:,}" for v in value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table() -> str:
    """The markdown table of ``CONSTANTS`` that ``docs/cost-model.md`` holds."""
    rows = ["| constant | value | unit | source | description |", "| --- | --- | --- | --- | --- |"]
    rows += [f"| `{c.name}` | {shown(c.value)} | {c.unit} | {c.source} | {c.description} |"
             for c in CONSTANTS.values()]
    return "\n".join(rows) + "\n"
