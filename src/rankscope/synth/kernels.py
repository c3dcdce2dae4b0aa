"""The CUDA kernels the simulated model launches: their names as they appear in H100 bf16 traces (and
the FP32 cuBLAS ones fp32_gemm swaps in), and the launch shapes of the GEMM and elementwise kernels."""
from __future__ import annotations

from rankscope.synth.constants import NUM_SMS
from rankscope.synth.program import Kernel


# Kernel names as they appear in H100 bf16 traces.
_GEMM_TN = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
            "kernel__5x_cublas")
_GEMM_NN = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_"
            "kernel__5x_cublas")
_GEMM_NT = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_"
            "kernel__5x_cublas")
_LN_FWD = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
           "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)")
_LN_BWD_INPUT = ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, "
                 "float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, "
                 "c10::BFloat16 const*, c10::BFloat16*, int)")
_LN_BWD_GAMMA = ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<c10::BFloat16, "
                 "float>(long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, "
                 "c10::BFloat16*, c10::BFloat16*)")
_FLASH_FWD = ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
              "false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, "
              "cutlass::bfloat16_t> >, false, true, false, false, true, true, false, "
              "false>(pytorch_flash::Flash_fwd_params)")
_FLASH_BWD_DOT = ("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, pytorch_flash::Flash_bwd_kernel_traits<128, "
                  "64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, "
                  "64, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params)")
_FLASH_BWD = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::Flash_bwd_kernel_"
              "traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, "
              "pytorch_flash::Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, true, false, false, "
              "false, false, false>(pytorch_flash::Flash_bwd_params)")
_FLASH_BWD_DQ = ("void pytorch_flash::flash_bwd_convert_dq_kernel<pytorch_flash::Flash_bwd_kernel_traits<128, 64, "
                 "128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, "
                 "128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params, int)")


def _elementwise(functor: str, arity: int) -> str:
    return (f"void at::native::vectorized_elementwise_kernel<4, {functor}, std::array<char*, {arity}ul> >"
            f"(int, {functor}, std::array<char*, {arity}ul>)")


_ADD = _elementwise("at::native::CUDAFunctor_add<c10::BFloat16>", 3)
_GELU = _elementwise("at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
                     "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
                     "operator()() const::{lambda(c10::BFloat16)#1}", 2)
_GELU_BWD = _elementwise("at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, "
                         "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
                         "operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}", 3)
_MUL_SCALAR = _elementwise("at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
                           "at::native::binary_internal::MulFunctor<float> >", 2)
_FILL = _elementwise("at::native::FillFunctor<c10::BFloat16>", 1)
_CAT = ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<at::native::"
        "(anonymous namespace)::OpaqueType<2u>, unsigned int, 3, 128, "
        "1>(at::native::(anonymous namespace)::OpaqueType<2u>*, "
        "at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::"
        "OpaqueType<2u>, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, "
        "4u>, int, unsigned int)")
_LOG_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, "
                "c10::BFloat16, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(c10::BFloat16*, "
                "c10::BFloat16 const*, int)")
_LOG_SOFTMAX_BWD = ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, c10::BFloat16, float, "
                    "c10::BFloat16, at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(c10::BFloat16*, "
                    "c10::BFloat16 const*, c10::BFloat16 const*, int)")
_NLL_FWD = ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<c10::BFloat16, float, "
            "long>(c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, long const*, c10::BFloat16 const*, bool, "
            "long, long, long, long)")
_NLL_BWD = ("void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<c10::BFloat16, "
            "long>(c10::BFloat16*, c10::BFloat16 const*, long const*, c10::BFloat16 const*, c10::BFloat16 const*, "
            "bool, int, int, long, long)")
_FOREACH_NORM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                 "(anonymous namespace)::TensorListMetadata<1>, "
                 "at::native::(anonymous namespace)::LpNormFunctor<c10::BFloat16, 2, float, float>, float*, "
                 "int>(at::native::(anonymous namespace)::TensorListMetadata<1>, "
                 "at::native::(anonymous namespace)::LpNormFunctor<c10::BFloat16, 2, float, float>, float*, int)")
_FOREACH_NORM_CLEANUP = ("void at::native::(anonymous namespace)::lpnorm_cleanup<float, 2, float, "
                         "float>(float const*, at::native::(anonymous namespace)::TensorListAddresses, int)")
_REDUCE_NORM = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, "
                "float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, "
                "at::native::NormTwoOps<float, float, float>, unsigned int, float, 4, 4>)")
_CLAMP = _elementwise("at::native::(anonymous namespace)::clamp_scalar_kernel_impl(at::TensorIteratorBase&, "
                      "c10::Scalar const&, "
                      "c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::"
                      "{lambda(float)#1}", 2)
_FOREACH_MUL = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::TensorListMetadata<1>, "
                "at::native::(anonymous namespace)::BinaryOpScalarTensorFunctor<c10::BFloat16, 1, 1, 0>, "
                "std::multiplies<float>, float const*>(at::native::(anonymous namespace)::TensorListMetadata<1>, "
                "at::native::(anonymous namespace)::BinaryOpScalarTensorFunctor<c10::BFloat16, 1, 1, 0>, "
                "std::multiplies<float>, float const*)")
_FUSED_ADAMW = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, "
                "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, "
                "false>, double*, double, double, double, double, double, bool, float*, "
                "float*>(at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, "
                "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, "
                "false>, double*, double, double, double, double, double, bool, float*, float*)")


#: FP32 cuBLAS kernels for the bf16 GEMMs: on H100 cuBLAS runs FP32 SGEMM (TF32 off, PyTorch's
#: default for matmul) with its sm80 SIMT kernels; names as they appear in real H100 profiles.
_FP32_GEMM_NAMES = {
    _GEMM_TN: "ampere_sgemm_128x64_tn",
    _GEMM_NN: "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
              "(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)",
    _GEMM_NT: "ampere_sgemm_128x64_nt",
}


def _gemm(name: str, dur_us: float) -> Kernel:
    return Kernel(name, dur_us, grid=(NUM_SMS, 1, 1), block=(384, 1, 1), registers=168, shared_mem=213_248, sigma=0.015)


def _ew(name: str, dur_us: float) -> Kernel:
    return Kernel(name, dur_us, grid=(8192, 1, 1), block=(128, 1, 1), registers=24)
