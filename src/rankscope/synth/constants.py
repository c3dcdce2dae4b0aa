"""Constants of the simulated job: the generator's name and version (in every ground truth), the profiled
steps and the model's size, the H100 node (GPUs, SMs, streams), record_shapes input types, the Kineto
timeline origin, NCCL's bandwidth and latency, and the noise and pacing of the host threads."""

GROUND_TRUTH_SCHEMA = "rankscope.ground_truth/1"
GROUND_TRUTH_FILE = "ground_truth.json"
GENERATOR = "rankscope.synth"
GENERATOR_VERSION = 2

FIRST_STEP = 5                  # ProfilerStep#5 is the first profiled step
DEFAULT_LAYERS = 6              # transformer blocks at scale=1
BUCKETS_PER_BLOCK = 4           # DDP buckets (all-reduces) per transformer block
PARAM_TENSORS_PER_BLOCK = 8     # 4 bias-free linears, 2 layer norms (weight, bias)
GPUS_PER_NODE = 8
NUM_SMS = 132
COMPUTE_STREAM = 7
COMM_STREAM = 20
BF16 = "c10::BFloat16"
# record_shapes inputs without dims
SCALAR: tuple[list, str] = ([], "Scalar")
NONE: tuple[list, str] = ([], "")
TENSORS: tuple[list, str] = ([], "TensorList")

BASE_TIME_NS = 1_790_857_026_000_000_000    # "baseTimeNanoseconds": an epoch in whole seconds
TRACE_ORIGIN_NS = 4_457_526_208_000_000     # job time 0 as a Kineto ts (µs since that base) × 1000
DEVICE_MEM_BASE_ADDR = 139_637_976_727_552  # 0x7F0000000000, where [memory] Addr values start

# Hardware and software constants of the simulated job.
BUS_BANDWIDTH_GBPS = 200.0       # effective busbw of 8-34 MB all-reduces on 8x H100 NVLink (peak ~400 at >=256 MB)
NCCL_BASE_LATENCY_US = 12.0
NCCL_HOP_LATENCY_US = 1.5
COLLECTIVE_END_JITTER_NS = 3_000  # NCCL kernels of one collective end within this on all ranks
KERNEL_LAUNCH_LATENCY_NS = 4_000  # runtime call start -> earliest kernel start
LAUNCH_CALL_US = 5.0              # cudaLaunchKernel CPU time
LAUNCH_LOOP_US = 2.0              # host time between the launches of a multi-kernel op
RESERVE_GRANULE_BYTES = 20 << 20  # caching allocator grows reserved memory in these steps

# Noise (lognormal sigmas) and pacing of the host threads.
RANK_CPU_SPEED_SIGMA = 0.02      # healthy ranks differ by ~1-3 %
RANK_GPU_SPEED_SIGMA = 0.01
CPU_OP_SIGMA = 0.10             # every host duration, DataLoader included
TRANSFER_SIGMA = 0.03
PYTHON_GAP_US = 35.0             # Python between top-level forward ops (outside any profiled op)
AUTOGRAD_GAP_US = 6.0            # engine overhead between backward nodes
OPTIMIZER_GAP_US = 12.0
DATALOADER_US = 1_300.0          # DataLoader __next__ of a healthy rank (workers keep up)
STEP_START_JITTER_US = 150.0     # ranks start profiling at slightly different times
