// Marking rules: which physical buffers of one autograd-saved grouped-linear input the stash
// takes (docs/design.md "marked buffer"; research domain.md §1.3, §1.6).
//
// Transformer Engine tags the tensors that Megatron's paged stash may take with a Python
// attribute, `grouped_tensor_scale_inv` (mark_grouped_tensor, extended by TE PR #3423). The
// attribute lives on one Python object and is lost by view/reshape/detach, so stashd does not
// rely on it alone: the caller describes what autograd saved (a SavedInputView) and
// MarkedBuffers() applies the same rules TE applies when it sets the attribute:
//
//   saved input                              marked buffers (role, rows, divisor)
//   ---------------------------------------  ---------------------------------------------------
//   absent (None)                            none
//   plain tensor                             the tensor (kData, max_tokens, 1)
//   unquantized BF16/FP16 grouped storage    rowwise_data (kData, max_tokens, 1)
//   MXFP8 grouped storage (wgrad only)       columnwise_data (kColumnwiseData, max_tokens, 1)
//                                            columnwise_scale_inv (kColumnwiseScaleInv,
//                                                                  max_tokens / 32, 32)
//
// Every marked buffer is token-major: row i belongs to token i (or, for a columnwise scale_inv,
// to tokens [32i, 32i + 32)), so only a prefix of rows is ever valid and the stash copies just
// that prefix. The Python layer mirrors these rules; TeMarkerValue() and kTeMarkerAttribute
// name what it reads.
//
// Everything here is a pure function of its arguments: thread-safe, no global state, no device
// access. Addresses are opaque numbers and never dereferenced.
#ifndef STASH_MARKING_H_
#define STASH_MARKING_H_

#include <cstdint>
#include <vector>

#include "stash/export.h"
#include "stash/status.h"

namespace stash {

// The name of the Python attribute Transformer Engine sets on a tensor the paged stash may take.
// Its presence marks the tensor; its value is TeMarkerValue() of the tensor's role.
inline constexpr char kTeMarkerAttribute[] = "grouped_tensor_scale_inv";

// MXFP8 holds one E8M0 scale per 32 consecutive values; a columnwise scale_inv therefore has one
// row per 32 tokens (Megatron's SCALE_INV_BLOCK_SIZE).
inline constexpr uint32_t kScaleInvBlockTokens = 32;

// Element types of saved buffers. The numeric values are part of the C ABI: never reorder.
enum class DType : uint32_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
  kFloat8E4M3 = 3,  // MXFP8 data
  kFloat8E5M2 = 4,
  kFloat8E8M0 = 5,  // MXFP8 scales (power-of-two exponents)
  kUInt8 = 6,       // raw bytes; TE stores FP8 data and E8M0 scales as uint8
  kInt64 = 7,
};

// Bytes per element: 4, 2, 2, 1, 1, 1, 1, 8. 0 for a value outside the enum (which
// MarkedBuffers() rejects), so a bad cast through the C ABI never looks like a real size.
STASH_EXPORT uint32_t DTypeBytes(DType dtype);

// PyTorch's name for the dtype without the "torch." prefix ("bfloat16", "float8_e4m3fn",
// "float8_e8m0fnu", ...), as error messages and the Python layer spell it. "unknown" outside
// the enum.
STASH_EXPORT const char* DTypeName(DType dtype);

// True for the 1-byte floating-point types (E4M3, E5M2, E8M0): quantized payloads.
STASH_EXPORT bool IsFloat8(DType dtype);

// One contiguous buffer in the trainer's address space: [address, address + bytes).
// `address` is an opaque pointer value or handle (a CUDA device pointer, a host pointer in
// tests); it is never dereferenced here. address 0 with bytes 0 = absent (a None field).
struct BufferView {
  uint64_t address = 0;
  uint64_t bytes = 0;
  DType dtype = DType::kUInt8;

  bool absent() const { return address == 0 && bytes == 0; }
};

// What autograd saved for one grouped-linear input.
enum class SavedKind : uint32_t {
  kAbsent = 0,   // nothing saved (None), e.g. the layer needs no weight gradient
  kPlain = 1,    // a plain torch.Tensor: `plain`
  kGrouped = 2,  // a TE GroupedTensorStorage: the rowwise/columnwise fields
};

// The caller's description of one saved input. Build one with the factories below, or fill the
// fields: a field that autograd saved as None stays absent (the default).
struct STASH_EXPORT SavedInputView {
  SavedKind kind = SavedKind::kAbsent;

  // The static token budget of the layer (T_max, HybridEP's num_permuted_tokens): the row count
  // of every token-major buffer. Must be > 0 unless kind is kAbsent, and a multiple of 32 for
  // MXFP8 storage.
  uint64_t max_tokens = 0;

  // kPlain only: the tensor, flattened; its row width is bytes / max_tokens.
  BufferView plain;

  // kGrouped only. True when the storage is MXFP8-quantized; false for unquantized BF16/FP16
  // storage (which has rowwise_data only). Buffers are GroupedTensorStorage's 1-D flattened
  // fields; `rowwise_scale_inv` is TE's `scale_inv`.
  bool mxfp8 = false;
  BufferView rowwise_data;
  BufferView columnwise_data;
  BufferView rowwise_scale_inv;
  BufferView columnwise_scale_inv;

  static SavedInputView Absent();
  static SavedInputView Plain(uint64_t max_tokens, BufferView tensor);
  static SavedInputView UnquantizedGrouped(uint64_t max_tokens, BufferView rowwise_data);
  static SavedInputView MxFp8Grouped(uint64_t max_tokens, BufferView columnwise_data,
                                     BufferView columnwise_scale_inv);
};

// What rows of a marked buffer hold.
enum class BufferRole : uint32_t {
  kData = 0,                // one row per token: a plain tensor, or unquantized rowwise_data
  kColumnwiseData = 1,      // one row per token: MXFP8 columnwise_data (token-major, not
                            // transposed: TE keeps the rowwise shape)
  kColumnwiseScaleInv = 2,  // one row per 32 tokens: MXFP8 columnwise_scale_inv
};

// "data", "columnwise_data", "columnwise_scale_inv"; "unknown" outside the enum.
STASH_EXPORT const char* BufferRoleName(BufferRole role);

// The value TE gives kTeMarkerAttribute on a buffer of this role: false for both kinds of data
// rows, true for a columnwise scale_inv. A marker value of true is what tells the Python layer
// to divide row counts by 32.
STASH_EXPORT bool TeMarkerValue(BufferRole role);

// Tokens per row of a buffer of this role: 1 for data, kScaleInvBlockTokens for a columnwise
// scale_inv.
STASH_EXPORT uint32_t RowDivisor(BufferRole role);

// One buffer the stash may take. Invariant: max_rows * row_bytes == buffer.bytes, max_rows > 0,
// and row_bytes is a whole number of buffer.dtype elements.
struct MarkedBuffer {
  BufferView buffer;
  BufferRole role = BufferRole::kData;
  uint64_t max_rows = 0;   // rows the buffer holds: max_tokens / divisor
  uint64_t row_bytes = 0;  // bytes per row
  uint32_t divisor = 1;    // tokens per row: the valid rows are ValidRows(num_tokens, divisor)
};

// The buffers of `view` the stash takes, in a fixed order (for MXFP8: columnwise_data, then
// columnwise_scale_inv). OK with an empty list for an absent input.
//
// MXFP8 storage never yields rowwise_data or rowwise_scale_inv, even when they are present:
// TE's wgrad consumes only the columnwise representation, so those stay resident (or were
// already dropped). Fields that a kind does not use are ignored, except that unquantized storage
// with any columnwise or scale field set is rejected (it looks like MXFP8 storage described
// with mxfp8 = false).
//
// INVALID_ARGUMENT, naming the offending field and what to change, when the view is not
// consistent: an unknown kind or dtype; max_tokens 0, or not a multiple of 32 for MXFP8; a
// plain tensor of 0 bytes; a present buffer with address 0, with 0 bytes, with a size that is
// negative as a signed 64-bit number, or that wraps the address space; MXFP8 storage without
// columnwise_data or columnwise_scale_inv, or with dtypes that are not 1-byte MXFP8 types;
// unquantized storage without rowwise_data, or whose rowwise_data is not BF16/FP16 (FP8
// included); a buffer whose bytes are not a multiple of its row count, or whose rows are not a
// whole number of elements.
STASH_EXPORT StatusOr<std::vector<MarkedBuffer>> MarkedBuffers(const SavedInputView& view);

// The valid rows of a marked buffer when `count` tokens are valid: ceil(count / divisor), so
// the scale row of a partial last block of 32 tokens is kept (40 tokens are 2 rows). With
// router padding for quantization the count is a multiple of 32 and this is Megatron's
// count / 32. A negative count (garbage from a device scalar) and divisor 0 both give 0 rows.
// The result is not clamped to max_rows: a count beyond the budget is the caller's overflow.
STASH_EXPORT uint64_t ValidRows(int64_t count, uint32_t divisor);

}  // namespace stash

#endif  // STASH_MARKING_H_
