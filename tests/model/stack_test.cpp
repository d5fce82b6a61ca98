// model/stack.h: the stored stack JSON (Ingero's keys and ours), content hashing, call sites and
// the one-line labels the text report prints.
#include <gtest/gtest.h>

#include "model/stack.h"

using namespace ingero;

TEST(StackCodec, ReadsIngeroNativeFramesAndOurPythonAndKernelFrames) {
  const ParsedStack p = parse_stack_frames(
      R"([{"i":"0x7f993b40fb8b","f":"libcudart.so.12"},{"s":"cudaDeviceSynchronize+0x185","f":"libcudart.so.12"},)"
      R"({"pf":"train.py","pfn":"Trainer.step","pl":142},{"k":"futex_wait+0x1a"},{"truncated":true}])");
  ASSERT_EQ(p.frames.size(), 4u);
  EXPECT_FALSE(p.malformed);
  EXPECT_TRUE(p.truncated);
  EXPECT_EQ(p.frames[0].kind, FrameKind::kNative);
  EXPECT_EQ(p.frames[0].ip, 0x7f993b40fb8bull);
  EXPECT_EQ(p.frames[1].function, "cudaDeviceSynchronize");
  EXPECT_EQ(p.frames[1].offset, 0x185u);
  EXPECT_EQ(p.frames[1].module, "libcudart.so.12");
  EXPECT_EQ(p.frames[2].kind, FrameKind::kPython);
  EXPECT_EQ(frame_text(p.frames[2]), "train.py:142 in Trainer.step");
  EXPECT_EQ(p.frames[3].kind, FrameKind::kKernel);
  EXPECT_EQ(p.frames[3].function, "futex_wait");
}

TEST(StackCodec, EncodeThenParseGivesTheSameStackAndHash) {
  ParsedStack s;
  s.frames.push_back({FrameKind::kNative, "cudaLaunchKernel", "", 0, "libcudart.so.13", 0x40, 0});
  s.frames.push_back({FrameKind::kNative, "", "", 0, "libffi.so.8", 0, 0x7abc});
  s.frames.push_back({FrameKind::kPython, "forward", "model.py", 12, "", 0, 0});
  s.truncated = true;
  const StackTrace st = encode_stack(s, {0x1, 0x2});
  EXPECT_EQ(st.ips, R"(["0x1","0x2"])");
  const ParsedStack back = parse_stack(st);
  ASSERT_EQ(back.frames.size(), 3u);
  EXPECT_TRUE(back.truncated);
  EXPECT_EQ(back.frames[0].function, "cudaLaunchKernel");
  EXPECT_EQ(back.frames[0].offset, 0x40u);
  EXPECT_EQ(back.frames[1].ip, 0x7abcu);
  EXPECT_EQ(back.frames[2].line, 12u);
  EXPECT_EQ(stack_content_hash(back), stack_content_hash(s));
  ParsedStack other = s;
  other.frames[2].line = 13;
  EXPECT_NE(stack_content_hash(other), stack_content_hash(s));
  EXPECT_NE(stack_content_hash(ParsedStack{}), 0u);
}

TEST(StackCodec, MalformedJsonIsFlaggedNeverThrown) {
  EXPECT_TRUE(parse_stack_frames("{not json").malformed);
  EXPECT_TRUE(parse_stack_frames(R"({"s":"x"})").malformed);
  EXPECT_TRUE(parse_stack_frames(R"([1, {"s":"ok"}])").malformed);
  EXPECT_EQ(parse_stack_frames(R"([1, {"s":"ok"}])").frames.size(), 1u);
  EXPECT_TRUE(parse_stack_frames("").frames.empty());
  // Non-UTF-8 bytes from a trace are replaced on encode, not thrown on.
  ParsedStack s;
  s.frames.push_back({FrameKind::kPython, "f\xff", "a\xfe.py", 1, "", 0, 0});
  EXPECT_FALSE(parse_stack(encode_stack(s)).malformed);
}

TEST(StackCodec, CallSiteIsTheInnermostPythonFrameElseTheCallerOfTheGpuLibrary) {
  ParsedStack s;
  s.frames.push_back({FrameKind::kNative, "cudaMalloc", "", 0, "libcudart.so.12", 0, 0});
  s.frames.push_back({FrameKind::kNative, "c10::cuda::alloc", "", 0, "libc10_cuda.so", 0, 0});
  ASSERT_NE(call_site(s), nullptr);
  EXPECT_EQ(call_site(s)->function, "c10::cuda::alloc");
  s.frames.push_back({FrameKind::kPython, "step", "train.py", 88, "", 0, 0});
  EXPECT_EQ(call_site(s)->function, "step");
  EXPECT_EQ(call_site(ParsedStack{}), nullptr);
}

TEST(StackLabel, CppSymbolsLoseReturnTypeTemplateArgumentsAndParameters) {
  EXPECT_EQ(short_symbol("void at::native::gpu_kernel_impl_nocast<__nv_hdl_wrapper_t<false, __nv_dl_tag<void (*)(int), "
                         "&at::native::(anonymous namespace)::launch, 7u>, float (float)> >(at::TensorIteratorBase&, "
                         "float const&)"),
            "at::native::gpu_kernel_impl_nocast<\u2026>()");
  EXPECT_EQ(short_symbol("bool at::cuda::blas::gemm_and_bias<float, float>(bool, long)"),
            "at::cuda::blas::gemm_and_bias<\u2026>()");
  EXPECT_EQ(short_symbol("std::vector<int, std::allocator<int> >::operator[](unsigned long) const"),
            "std::vector<\u2026>::operator[]()");
  EXPECT_EQ(short_symbol("a::b::operator<(a::b const&)"), "a::b::operator<()");
  EXPECT_EQ(short_symbol("(anonymous namespace)::foo(int)"), "(anonymous namespace)::foo()");
  EXPECT_EQ(short_symbol("cudaLaunchKernel"), "cudaLaunchKernel");
  EXPECT_EQ(short_symbol("_PyEval_EvalFrameDefault"), "_PyEval_EvalFrameDefault");
  StackFrame f{FrameKind::kNative, "bool ns::g<int>(int)", "", 0, "libx.so", 0, 0};
  EXPECT_EQ(frame_label(f), "ns::g<\u2026>() in libx.so");
  EXPECT_EQ(frame_text(f), "bool ns::g<int>(int) in libx.so");
}
