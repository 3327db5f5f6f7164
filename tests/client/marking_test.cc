// The marking rules of include/stash/marking.h: which physical buffers of a saved
// grouped-linear input are stashed (TE PR #3423, research domain.md §1.3 and §1.6), and the
// errors an inconsistent description gets.
#include "stash/marking.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

namespace stash {
namespace {

// A DeepSeek-V3-like layer: a 4096-token budget and a 7168-wide hidden dimension.
constexpr uint64_t kTokens = 4096;
constexpr uint64_t kHidden = 7168;

// Opaque addresses: never dereferenced, so any distinct non-zero values do.
constexpr uint64_t kAddrA = 0x7f0000000000;
constexpr uint64_t kAddrB = 0x7f1000000000;
constexpr uint64_t kAddrC = 0x7f2000000000;
constexpr uint64_t kAddrD = 0x7f3000000000;

BufferView Buf(uint64_t address, uint64_t bytes, DType dtype) { return {address, bytes, dtype}; }

// MXFP8 storage as TE saves it for wgrad: E4M3 columnwise data (token-major, [T, K]) and E8M0
// columnwise scales ([T/32, K]).
SavedInputView MxFp8View() {
  return SavedInputView::MxFp8Grouped(kTokens, Buf(kAddrA, kTokens * kHidden, DType::kFloat8E4M3),
                                      Buf(kAddrB, kTokens / 32 * kHidden, DType::kFloat8E8M0));
}

// The invariant every marked buffer keeps (marking.h, MarkedBuffer).
void ExpectWellFormed(const MarkedBuffer& m) {
  EXPECT_GT(m.max_rows, 0u);
  EXPECT_EQ(m.max_rows * m.row_bytes, m.buffer.bytes);
  EXPECT_EQ(m.row_bytes % DTypeBytes(m.buffer.dtype), 0u);
  EXPECT_EQ(m.divisor, RowDivisor(m.role));
}

// Success when MarkedBuffers(view) fails with INVALID_ARGUMENT and its message holds every one
// of `words` (the offending field, and what to change).
::testing::AssertionResult RejectedNaming(const SavedInputView& view,
                                          std::initializer_list<const char*> words) {
  StatusOr<std::vector<MarkedBuffer>> r = MarkedBuffers(view);
  if (r.ok()) {
    return ::testing::AssertionFailure() << "accepted, with " << r->size() << " buffers";
  }
  if (r.status().code() != StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << "wrong code: " << r.status().ToString();
  }
  for (const char* word : words) {
    if (r.status().message().find(word) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message does not name \"" << word << "\": " << r.status().message();
    }
  }
  return ::testing::AssertionSuccess() << r.status().message();
}

// --- The rules -----------------------------------------------------------------------------

TEST(Marking, AbsentInputGivesNoBuffers) {
  StatusOr<std::vector<MarkedBuffer>> r = MarkedBuffers(SavedInputView::Absent());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->empty());
}

TEST(Marking, AbsentInputIgnoresItsOtherFields) {
  SavedInputView view = MxFp8View();
  view.kind = SavedKind::kAbsent;
  view.max_tokens = 0;
  StatusOr<std::vector<MarkedBuffer>> r = MarkedBuffers(view);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->empty());
}

TEST(Marking, PlainTensorGivesItselfWithOneRowPerToken) {
  // activation_in: bf16 [T, 2 * ffn].
  const BufferView tensor = Buf(kAddrA, kTokens * 2 * 2048 * 2, DType::kBFloat16);
  StatusOr<std::vector<MarkedBuffer>> r = MarkedBuffers(SavedInputView::Plain(kTokens, tensor));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  const MarkedBuffer& m = (*r)[0];
  EXPECT_EQ(m.buffer.address, kAddrA);
  EXPECT_EQ(m.buffer.bytes, tensor.bytes);
  EXPECT_EQ(m.buffer.dtype, DType::kBFloat16);
  EXPECT_EQ(m.role, BufferRole::kData);
  EXPECT_EQ(m.max_rows, kTokens);
  EXPECT_EQ(m.row_bytes, 2u * 2048 * 2);
  EXPECT_EQ(m.divisor, 1u);
  ExpectWellFormed(m);
}

TEST(Marking, PlainTensorOfOneValuePerTokenHasRowsOfOneElement) {
  // Router probabilities: one fp32 value per token.
  StatusOr<std::vector<MarkedBuffer>> r =
      MarkedBuffers(SavedInputView::Plain(kTokens, Buf(kAddrA, kTokens * 4, DType::kFloat32)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].max_rows, kTokens);
  EXPECT_EQ((*r)[0].row_bytes, 4u);
  ExpectWellFormed((*r)[0]);
}

TEST(Marking, PlainFloat8TensorIsStashedAsIs) {
  // An FP8 cast of a saved input (Megatron #6828) is still one plain tensor.
  StatusOr<std::vector<MarkedBuffer>> r = MarkedBuffers(
      SavedInputView::Plain(kTokens, Buf(kAddrA, kTokens * kHidden, DType::kFloat8E4M3)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].role, BufferRole::kData);
  EXPECT_EQ((*r)[0].row_bytes, kHidden);
}

TEST(Marking, Bf16GroupedStorageGivesRowwiseData) {
  const BufferView rowwise = Buf(kAddrA, kTokens * kHidden * 2, DType::kBFloat16);
  StatusOr<std::vector<MarkedBuffer>> r =
      MarkedBuffers(SavedInputView::UnquantizedGrouped(kTokens, rowwise));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  const MarkedBuffer& m = (*r)[0];
  EXPECT_EQ(m.buffer.address, kAddrA);
  EXPECT_EQ(m.buffer.bytes, rowwise.bytes);
  EXPECT_EQ(m.role, BufferRole::kData);
  EXPECT_EQ(m.max_rows, kTokens);
  EXPECT_EQ(m.row_bytes, kHidden * 2);
  EXPECT_EQ(m.divisor, 1u);
  ExpectWellFormed(m);
}

TEST(Marking, Fp16GroupedStorageGivesRowwiseData) {
  const BufferView rowwise = Buf(kAddrB, kTokens * 2048 * 2, DType::kFloat16);
  StatusOr<std::vector<MarkedBuffer>> r =
      MarkedBuffers(SavedInputView::UnquantizedGrouped(kTokens, rowwise));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  const MarkedBuffer& m = (*r)[0];
  EXPECT_EQ(m.buffer.address, kAddrB);
  EXPECT_EQ(m.buffer.dtype, DType::kFloat16);
  EXPECT_EQ(m.role, BufferRole::kData);
  EXPECT_EQ(m.max_rows, kTokens);
  EXPECT_EQ(m.row_bytes, 2048u * 2);
  EXPECT_EQ(m.divisor, 1u);
  ExpectWellFormed(m);
}

TEST(Marking, MxFp8GivesColumnwiseDataAndScaleInvNotRowwise) {
  SavedInputView view = MxFp8View();
  // Rowwise fields a caller still passes are never stashed.
  view.rowwise_data = Buf(kAddrC, kTokens * kHidden, DType::kFloat8E4M3);
  view.rowwise_scale_inv = Buf(kAddrD, kTokens * kHidden / 32, DType::kFloat8E8M0);
  StatusOr<std::vector<MarkedBuffer>> r = MarkedBuffers(view);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);

  const MarkedBuffer& data = (*r)[0];
  EXPECT_EQ(data.buffer.address, kAddrA);
  EXPECT_EQ(data.role, BufferRole::kColumnwiseData);
  EXPECT_EQ(data.max_rows, kTokens);
  EXPECT_EQ(data.row_bytes, kHidden);
  EXPECT_EQ(data.divisor, 1u);
  ExpectWellFormed(data);

  const MarkedBuffer& scale = (*r)[1];
  EXPECT_EQ(scale.buffer.address, kAddrB);
  EXPECT_EQ(scale.role, BufferRole::kColumnwiseScaleInv);
  EXPECT_EQ(scale.max_rows, kTokens / 32);
  EXPECT_EQ(scale.row_bytes, kHidden);
  EXPECT_EQ(scale.divisor, 32u);
  ExpectWellFormed(scale);

  for (const MarkedBuffer& m : *r) {
    EXPECT_NE(m.buffer.address, kAddrC) << "rowwise_data was marked";
    EXPECT_NE(m.buffer.address, kAddrD) << "rowwise_scale_inv was marked";
  }
}

TEST(Marking, MxFp8ScaleInvRowWidthIsBytesOverTokensOver32) {
  // The CuTe test geometry: a 2048-byte-wide columnwise scale_inv with T/32 rows, next to
  // 2048-wide data.
  const uint64_t tokens = 131072;
  StatusOr<std::vector<MarkedBuffer>> r = MarkedBuffers(
      SavedInputView::MxFp8Grouped(tokens, Buf(kAddrA, tokens * 2048, DType::kFloat8E4M3),
                                   Buf(kAddrB, tokens / 32 * 2048, DType::kFloat8E8M0)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[1].max_rows, 4096u);
  EXPECT_EQ((*r)[1].row_bytes, 2048u);
}

TEST(Marking, MxFp8AcceptsUInt8BuffersAsTeStoresThem) {
  StatusOr<std::vector<MarkedBuffer>> r = MarkedBuffers(
      SavedInputView::MxFp8Grouped(kTokens, Buf(kAddrA, kTokens * kHidden, DType::kUInt8),
                                   Buf(kAddrB, kTokens / 32 * kHidden, DType::kUInt8)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].role, BufferRole::kColumnwiseData);
  EXPECT_EQ((*r)[1].role, BufferRole::kColumnwiseScaleInv);
}

TEST(Marking, RolesCarryTeMarkerValuesAndDivisors) {
  EXPECT_STREQ(kTeMarkerAttribute, "grouped_tensor_scale_inv");
  EXPECT_EQ(kScaleInvBlockTokens, 32u);
  EXPECT_FALSE(TeMarkerValue(BufferRole::kData));
  EXPECT_FALSE(TeMarkerValue(BufferRole::kColumnwiseData));
  EXPECT_TRUE(TeMarkerValue(BufferRole::kColumnwiseScaleInv));
  EXPECT_EQ(RowDivisor(BufferRole::kData), 1u);
  EXPECT_EQ(RowDivisor(BufferRole::kColumnwiseData), 1u);
  EXPECT_EQ(RowDivisor(BufferRole::kColumnwiseScaleInv), 32u);
  EXPECT_STREQ(BufferRoleName(BufferRole::kData), "data");
  EXPECT_STREQ(BufferRoleName(BufferRole::kColumnwiseData), "columnwise_data");
  EXPECT_STREQ(BufferRoleName(BufferRole::kColumnwiseScaleInv), "columnwise_scale_inv");
  EXPECT_STREQ(BufferRoleName(static_cast<BufferRole>(9)), "unknown");
}

TEST(Marking, DTypesHaveTorchNamesAndSizes) {
  const struct {
    DType dtype;
    uint32_t bytes;
    const char* name;
  } cases[] = {{DType::kFloat32, 4, "float32"},
               {DType::kBFloat16, 2, "bfloat16"},
               {DType::kFloat16, 2, "float16"},
               {DType::kFloat8E4M3, 1, "float8_e4m3fn"},
               {DType::kFloat8E5M2, 1, "float8_e5m2"},
               {DType::kFloat8E8M0, 1, "float8_e8m0fnu"},
               {DType::kUInt8, 1, "uint8"},
               {DType::kInt64, 8, "int64"}};
  for (const auto& c : cases) {
    EXPECT_EQ(DTypeBytes(c.dtype), c.bytes) << c.name;
    EXPECT_STREQ(DTypeName(c.dtype), c.name);
  }
  EXPECT_EQ(DTypeBytes(static_cast<DType>(42)), 0u);
  EXPECT_STREQ(DTypeName(static_cast<DType>(42)), "unknown");
  EXPECT_TRUE(IsFloat8(DType::kFloat8E4M3));
  EXPECT_TRUE(IsFloat8(DType::kFloat8E5M2));
  EXPECT_TRUE(IsFloat8(DType::kFloat8E8M0));
  EXPECT_FALSE(IsFloat8(DType::kUInt8));
  EXPECT_FALSE(IsFloat8(DType::kBFloat16));
}

// --- Inconsistent views ----------------------------------------------------------------------

TEST(Marking, RejectsMxFp8WithoutColumnwiseData) {
  SavedInputView view = MxFp8View();
  view.columnwise_data = {};
  EXPECT_TRUE(RejectedNaming(view, {"columnwise_data",
                                    "wgrad-only MXFP8 saves the columnwise "
                                    "representation"}));
}

TEST(Marking, RejectsMxFp8WithoutColumnwiseScaleInv) {
  SavedInputView view = MxFp8View();
  view.columnwise_scale_inv = {};
  EXPECT_TRUE(RejectedNaming(view, {"no columnwise_scale_inv",
                                    "wgrad-only MXFP8 saves the "
                                    "columnwise representation"}));
}

TEST(Marking, RejectsMxFp8WithOnlyTheRowwiseRepresentation) {
  SavedInputView view;
  view.kind = SavedKind::kGrouped;
  view.mxfp8 = true;
  view.max_tokens = kTokens;
  view.rowwise_data = Buf(kAddrA, kTokens * kHidden, DType::kFloat8E4M3);
  view.rowwise_scale_inv = Buf(kAddrB, kTokens * kHidden / 32, DType::kFloat8E8M0);
  EXPECT_TRUE(RejectedNaming(view, {"no columnwise_data", "wgrad-only MXFP8"}));
}

TEST(Marking, RejectsMxFp8WithHighPrecisionColumnwiseData) {
  SavedInputView view = MxFp8View();
  view.columnwise_data = Buf(kAddrA, kTokens * kHidden * 2, DType::kBFloat16);
  EXPECT_TRUE(RejectedNaming(view, {"columnwise_data.dtype", "bfloat16"}));
}

TEST(Marking, RejectsMxFp8ScaleInvThatIsNotE8M0) {
  SavedInputView view = MxFp8View();
  view.columnwise_scale_inv.dtype = DType::kFloat8E4M3;
  EXPECT_TRUE(RejectedNaming(view, {"columnwise_scale_inv.dtype", "float8_e8m0fnu"}));
}

TEST(Marking, RejectsMxFp8HiddenSizeNotAMultipleOf32) {
  const uint64_t hidden = 100;
  EXPECT_TRUE(RejectedNaming(
      SavedInputView::MxFp8Grouped(kTokens, Buf(kAddrA, kTokens * hidden, DType::kFloat8E4M3),
                                   Buf(kAddrB, kTokens / 32 * 128, DType::kFloat8E8M0)),
      {"columnwise_data", "multiple of 32"}));
}

TEST(Marking, RejectsUnquantizedStorageWithoutRowwiseData) {
  SavedInputView view = SavedInputView::UnquantizedGrouped(kTokens, {});
  EXPECT_TRUE(RejectedNaming(view, {"no rowwise_data", "mxfp8 = true"}));
}

TEST(Marking, RejectsUnquantizedStorageThatIsNotBf16OrFp16) {
  EXPECT_TRUE(RejectedNaming(SavedInputView::UnquantizedGrouped(
                                 kTokens, Buf(kAddrA, kTokens * kHidden * 4, DType::kFloat32)),
                             {"rowwise_data.dtype", "float32", "bfloat16 or float16"}));
}

TEST(Marking, RejectsFloat8DtypesOnUnquantizedStorage) {
  for (DType dtype : {DType::kFloat8E4M3, DType::kFloat8E5M2, DType::kFloat8E8M0}) {
    EXPECT_TRUE(
        RejectedNaming(SavedInputView::UnquantizedGrouped(kTokens, Buf(kAddrA, kTokens, dtype)),
                       {"rowwise_data.dtype", DTypeName(dtype), "mxfp8 = true"}));
  }
}

TEST(Marking, RejectsUnquantizedStorageWithColumnwiseOrScaleFields) {
  const BufferView rowwise = Buf(kAddrA, kTokens * kHidden * 2, DType::kBFloat16);
  SavedInputView view = SavedInputView::UnquantizedGrouped(kTokens, rowwise);
  view.columnwise_data = Buf(kAddrB, kTokens * kHidden, DType::kFloat8E4M3);
  EXPECT_TRUE(RejectedNaming(view, {"columnwise_data", "mxfp8 = true"}));

  view = SavedInputView::UnquantizedGrouped(kTokens, rowwise);
  view.rowwise_scale_inv = Buf(kAddrB, kTokens * kHidden / 32, DType::kFloat8E8M0);
  EXPECT_TRUE(RejectedNaming(view, {"rowwise_scale_inv", "mxfp8 = true"}));

  view = SavedInputView::UnquantizedGrouped(kTokens, rowwise);
  view.columnwise_scale_inv = Buf(kAddrB, kTokens / 32 * kHidden, DType::kFloat8E8M0);
  EXPECT_TRUE(RejectedNaming(view, {"columnwise_scale_inv", "mxfp8 = true"}));
}

TEST(Marking, RejectsZeroMaxTokens) {
  EXPECT_TRUE(RejectedNaming(SavedInputView::Plain(0, Buf(kAddrA, kTokens * 4, DType::kFloat32)),
                             {"max_tokens is 0"}));
  EXPECT_TRUE(RejectedNaming(
      SavedInputView::UnquantizedGrouped(0, Buf(kAddrA, kTokens * 2, DType::kBFloat16)),
      {"max_tokens is 0"}));
  SavedInputView view = MxFp8View();
  view.max_tokens = 0;
  EXPECT_TRUE(RejectedNaming(view, {"max_tokens is 0"}));
}

TEST(Marking, RejectsMxFp8MaxTokensNotAMultipleOf32) {
  const uint64_t tokens = 4080;  // a multiple of 16, not of 32
  EXPECT_TRUE(RejectedNaming(
      SavedInputView::MxFp8Grouped(tokens, Buf(kAddrA, tokens * kHidden, DType::kFloat8E4M3),
                                   Buf(kAddrB, 127 * kHidden, DType::kFloat8E8M0)),
      {"max_tokens = 4080", "multiple of 32", "padding"}));
}

TEST(Marking, UnquantizedMaxTokensNeedNotBeAMultipleOf32) {
  StatusOr<std::vector<MarkedBuffer>> r = MarkedBuffers(
      SavedInputView::UnquantizedGrouped(4080, Buf(kAddrA, 4080 * kHidden * 2, DType::kBFloat16)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].max_rows, 4080u);
}

TEST(Marking, RejectsBufferNotAMultipleOfItsRowCount) {
  EXPECT_TRUE(
      RejectedNaming(SavedInputView::Plain(kTokens, Buf(kAddrA, kTokens * 4 + 4, DType::kFloat32)),
                     {"plain.bytes", "max_tokens = 4096"}));
  EXPECT_TRUE(RejectedNaming(SavedInputView::UnquantizedGrouped(
                                 kTokens, Buf(kAddrA, kTokens * kHidden * 2 - 2, DType::kBFloat16)),
                             {"rowwise_data.bytes", "max_tokens = 4096"}));
  SavedInputView view = MxFp8View();
  view.columnwise_data.bytes -= 1;
  EXPECT_TRUE(RejectedNaming(view, {"columnwise_data.bytes", "max_tokens = 4096"}));
  view = MxFp8View();
  view.columnwise_scale_inv.bytes += 1;
  EXPECT_TRUE(RejectedNaming(
      view, {"columnwise_scale_inv.bytes", "max_tokens / 32 = 128", "multiple of 128"}));
  // Fewer bytes than rows: no row can hold anything.
  EXPECT_TRUE(RejectedNaming(SavedInputView::Plain(kTokens, Buf(kAddrA, 64, DType::kUInt8)),
                             {"plain.bytes"}));
}

TEST(Marking, RejectsRowsThatSplitAnElement) {
  // 4096 rows of 2 bytes each cannot hold whole fp32 values.
  EXPECT_TRUE(
      RejectedNaming(SavedInputView::Plain(kTokens, Buf(kAddrA, kTokens * 2, DType::kFloat32)),
                     {"plain rows are 2 bytes", "float32"}));
}

TEST(Marking, RejectsBufferThatIsNotWholeElements) {
  EXPECT_TRUE(RejectedNaming(SavedInputView::Plain(kTokens, Buf(kAddrA, 4097, DType::kBFloat16)),
                             {"plain.bytes = 4097", "bfloat16"}));
}

TEST(Marking, RejectsZeroBytePlainTensor) {
  EXPECT_TRUE(RejectedNaming(SavedInputView::Plain(kTokens, Buf(kAddrA, 0, DType::kBFloat16)),
                             {"plain.bytes = 0", "kAbsent"}));
  EXPECT_TRUE(RejectedNaming(SavedInputView::Plain(kTokens, {}), {"plain.bytes = 0"}));
}

TEST(Marking, RejectsPresentGroupedBufferWithZeroBytes) {
  SavedInputView view = MxFp8View();
  view.columnwise_scale_inv.bytes = 0;
  EXPECT_TRUE(RejectedNaming(view, {"columnwise_scale_inv", "0 bytes"}));
}

TEST(Marking, RejectsBufferWithBytesButNoAddress) {
  SavedInputView view = MxFp8View();
  view.columnwise_data.address = 0;
  EXPECT_TRUE(RejectedNaming(view, {"columnwise_data", "address 0"}));
}

TEST(Marking, RejectsNegativeSizes) {
  // -1 and -4096 as they arrive through a uint64 C ABI field.
  const auto minus_one = static_cast<uint64_t>(int64_t{-1});
  EXPECT_TRUE(RejectedNaming(SavedInputView::Plain(kTokens, Buf(kAddrA, minus_one, DType::kUInt8)),
                             {"plain.bytes", "negative", "(-1)"}));
  EXPECT_TRUE(RejectedNaming(
      SavedInputView::UnquantizedGrouped(static_cast<uint64_t>(int64_t{-4096}),
                                         Buf(kAddrA, kTokens * kHidden * 2, DType::kBFloat16)),
      {"max_tokens", "negative", "(-4096)"}));
  SavedInputView view = MxFp8View();
  view.columnwise_scale_inv.bytes = minus_one;
  EXPECT_TRUE(RejectedNaming(view, {"columnwise_scale_inv.bytes", "negative"}));
}

TEST(Marking, RejectsBufferThatWrapsTheAddressSpace) {
  const uint64_t top = std::numeric_limits<uint64_t>::max() - 1024;
  EXPECT_TRUE(RejectedNaming(SavedInputView::Plain(kTokens, Buf(top, kTokens * 4, DType::kFloat32)),
                             {"plain", "wraps"}));
}

TEST(Marking, RejectsUnknownKindAndDType) {
  SavedInputView view = MxFp8View();
  view.kind = static_cast<SavedKind>(7);
  EXPECT_TRUE(RejectedNaming(view, {"kind = 7", "SavedKind"}));
  EXPECT_TRUE(RejectedNaming(
      SavedInputView::Plain(kTokens, Buf(kAddrA, kTokens * 4, static_cast<DType>(42))),
      {"plain.dtype = 42", "DType"}));
}

// --- ValidRows -------------------------------------------------------------------------------

TEST(ValidRows, DataRowsEqualTheTokenCount) {
  EXPECT_EQ(ValidRows(0, 1), 0u);
  EXPECT_EQ(ValidRows(1, 1), 1u);
  EXPECT_EQ(ValidRows(3000, 1), 3000u);
}

TEST(ValidRows, ScaleInvRowsAreTheCountOver32WhenPadded) {
  EXPECT_EQ(ValidRows(32, 32), 1u);
  EXPECT_EQ(ValidRows(2048, 32), 64u);
  EXPECT_EQ(ValidRows(4096, RowDivisor(BufferRole::kColumnwiseScaleInv)), 128u);
}

TEST(ValidRows, PartialScaleBlockRoundsUp) {
  // An unpadded count keeps the scale row of its last partial block (tokens 32..39 of 40).
  EXPECT_EQ(ValidRows(31, 32), 1u);
  EXPECT_EQ(ValidRows(40, 32), 2u);
  EXPECT_EQ(ValidRows(63, 32), 2u);
  EXPECT_EQ(ValidRows(65, 32), 3u);
}

TEST(ValidRows, NegativeCountOrZeroDivisorGivesNoRows) {
  EXPECT_EQ(ValidRows(-1, 1), 0u);
  EXPECT_EQ(ValidRows(std::numeric_limits<int64_t>::min(), 32), 0u);
  EXPECT_EQ(ValidRows(100, 0), 0u);
}

TEST(ValidRows, LargeCountsDoNotOverflow) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(ValidRows(big, 1), static_cast<uint64_t>(big));
  EXPECT_EQ(ValidRows(big, 32), static_cast<uint64_t>(big) / 32 + 1);  // 2^63 - 1 is odd
}

}  // namespace
}  // namespace stash
