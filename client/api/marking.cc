// Marking rules (stash/marking.h). The checks run in the order a reader of the error would fix
// them: the view's shape (kind, max_tokens), then which fields must be present, then each
// buffer's own sanity, then dtypes, then row geometry.
#include "stash/marking.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace stash {
namespace {

// Sizes travel as uint64 through the C ABI; one above this was a negative int64 on the caller's
// side (a -1 "unknown" or an overflowed product), never a real size.
constexpr uint64_t kMaxSize = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

std::string Str(uint64_t v) { return std::to_string(v); }

Status CheckMaxTokens(const SavedInputView& view) {
  if (view.max_tokens == 0) {
    return InvalidArgumentError(
        "max_tokens is 0: pass the layer's static token budget (T_max, the row count of every "
        "token-major saved buffer)");
  }
  if (view.max_tokens > kMaxSize) {
    return InvalidArgumentError("max_tokens = " + Str(view.max_tokens) +
                                " is negative as a signed 64-bit count (" +
                                std::to_string(static_cast<int64_t>(view.max_tokens)) +
                                "): pass the layer's static token budget");
  }
  return Status::Ok();
}

// The checks every present buffer passes, whatever its role. `field` names it in the message.
Status CheckPresentBuffer(const BufferView& b, const std::string& field) {
  if (b.bytes > kMaxSize) {
    return InvalidArgumentError(field + ".bytes = " + Str(b.bytes) +
                                " is negative as a signed 64-bit size (" +
                                std::to_string(static_cast<int64_t>(b.bytes)) +
                                "): pass the buffer's size in bytes (numel * element size)");
  }
  if (b.bytes == 0) {
    return InvalidArgumentError(field + " has address " + Str(b.address) +
                                " but 0 bytes: an empty buffer has nothing to stash; leave the "
                                "field absent (address 0, bytes 0) if autograd saved None");
  }
  if (b.address == 0) {
    return InvalidArgumentError(field + " has " + Str(b.bytes) +
                                " bytes but address 0: pass the buffer's data pointer");
  }
  if (b.address > std::numeric_limits<uint64_t>::max() - b.bytes) {
    return InvalidArgumentError(field + " [address " + Str(b.address) + ", +" + Str(b.bytes) +
                                " bytes) wraps the address space: check its address and bytes");
  }
  const uint32_t elem = DTypeBytes(b.dtype);
  if (elem == 0) {
    return InvalidArgumentError(field + ".dtype = " + Str(static_cast<uint32_t>(b.dtype)) +
                                " is not a stash::DType value");
  }
  if (b.bytes % elem != 0) {
    return InvalidArgumentError(field + ".bytes = " + Str(b.bytes) + " is not a whole number of " +
                                DTypeName(b.dtype) + " elements (" + Str(elem) +
                                " bytes each): check its dtype");
  }
  return Status::Ok();
}

// Splits a checked buffer into the rows of its role. max_tokens is a positive multiple of the
// role's divisor (the callers check that first), so max_rows > 0.
StatusOr<MarkedBuffer> Mark(const BufferView& b, const std::string& field, BufferRole role,
                            uint64_t max_tokens) {
  const uint32_t divisor = RowDivisor(role);
  const uint64_t rows = max_tokens / divisor;
  const std::string rows_text = divisor == 1 ? "max_tokens = " + Str(max_tokens)
                                             : "max_tokens / " + Str(divisor) + " = " + Str(rows);
  if (b.bytes % rows != 0) {
    // MXFP8 pads each expert's block of columnwise scale rows to a multiple of 4 (domain.md
    // §1.4), so T/32 equal rows exist only when every expert's tokens are a multiple of 128.
    const char* padding_hint =
        role == BufferRole::kColumnwiseScaleInv
            ? "; TE pads each expert's scale rows to a multiple of 4, so pad every expert's "
              "tokens to a multiple of 128"
            : "";
    return InvalidArgumentError(
        field + ".bytes = " + Str(b.bytes) + " is not a multiple of its row count (" + rows_text +
        "): a token-major buffer holds rows of equal width; pass the whole saved buffer and the "
        "layer's static token budget as max_tokens" +
        padding_hint);
  }
  const uint64_t row_bytes = b.bytes / rows;
  const uint32_t elem = DTypeBytes(b.dtype);
  if (row_bytes % elem != 0) {
    return InvalidArgumentError(field + " rows are " + Str(row_bytes) + " bytes (" + rows_text +
                                "), not a whole number of " + DTypeName(b.dtype) + " elements (" +
                                Str(elem) + " bytes each): check max_tokens and its dtype");
  }
  MarkedBuffer m;
  m.buffer = b;
  m.role = role;
  m.max_rows = rows;
  m.row_bytes = row_bytes;
  m.divisor = divisor;
  return m;
}

StatusOr<std::vector<MarkedBuffer>> MarkPlain(const SavedInputView& view) {
  if (Status s = CheckMaxTokens(view); !s.ok()) return s;
  if (view.plain.bytes == 0) {
    return InvalidArgumentError(
        "plain tensor has 0 bytes (plain.bytes = 0): there is nothing to stash; describe an input "
        "autograd did not save as kind = kAbsent, and leave empty tensors unmarked");
  }
  if (Status s = CheckPresentBuffer(view.plain, "plain"); !s.ok()) return s;
  StatusOr<MarkedBuffer> data = Mark(view.plain, "plain", BufferRole::kData, view.max_tokens);
  if (!data.ok()) return data.status();
  return std::vector<MarkedBuffer>{*data};
}

// Unquantized BF16/FP16 grouped storage has only a rowwise representation, so its rowwise_data is
// what autograd saves and what TE PR #3423 marks.
StatusOr<std::vector<MarkedBuffer>> MarkUnquantized(const SavedInputView& view) {
  if (Status s = CheckMaxTokens(view); !s.ok()) return s;
  // A columnwise or scale field means quantized storage described with mxfp8 = false; taking
  // rowwise_data from it would stash the representation wgrad never reads.
  const struct {
    const BufferView* buffer;
    const char* name;
  } quantized_only[] = {{&view.columnwise_data, "columnwise_data"},
                        {&view.rowwise_scale_inv, "rowwise_scale_inv"},
                        {&view.columnwise_scale_inv, "columnwise_scale_inv"}};
  for (const auto& f : quantized_only) {
    if (!f.buffer->absent()) {
      return InvalidArgumentError(
          std::string("unquantized grouped storage has ") + f.name +
          " set, but only quantized storage has a columnwise representation or scales: set mxfp8 "
          "= true if this input is MXFP8, else leave " +
          f.name + " absent");
    }
  }
  if (view.rowwise_data.absent()) {
    return InvalidArgumentError(
        "unquantized grouped storage has no rowwise_data: BF16/FP16 grouped storage saves its "
        "rowwise_data; pass it, or set mxfp8 = true for MXFP8 storage");
  }
  if (Status s = CheckPresentBuffer(view.rowwise_data, "rowwise_data"); !s.ok()) return s;
  const DType dtype = view.rowwise_data.dtype;
  if (IsFloat8(dtype)) {
    return InvalidArgumentError(
        std::string("rowwise_data.dtype is ") + DTypeName(dtype) +
        ", a quantized type, on grouped storage described as unquantized: set mxfp8 = true and "
        "pass columnwise_data and columnwise_scale_inv (wgrad-only MXFP8 saves the columnwise "
        "representation)");
  }
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) {
    return InvalidArgumentError(std::string("rowwise_data.dtype is ") + DTypeName(dtype) +
                                ": unquantized grouped storage is marked only when it is bfloat16 "
                                "or float16 (TE PR #3423); if autograd saved a plain tensor, "
                                "describe it with kind = kPlain");
  }
  StatusOr<MarkedBuffer> data =
      Mark(view.rowwise_data, "rowwise_data", BufferRole::kData, view.max_tokens);
  if (!data.ok()) return data.status();
  return std::vector<MarkedBuffer>{*data};
}

Status MissingColumnwise(const char* field) {
  return InvalidArgumentError(
      std::string("MXFP8 grouped storage has no ") + field +
      ": wgrad-only MXFP8 saves the columnwise representation: pass columnwise_data and "
      "columnwise_scale_inv (rowwise_data and rowwise_scale_inv are never stashed); if autograd "
      "saved the high-precision input instead (save_original_input), describe that tensor");
}

// MXFP8 storage saved for wgrad: TE drops the rowwise data and scales before saving ("wgrad only
// consumes the columnwise representation"), so only the columnwise pair is stashed. Rowwise
// fields, if the caller still passes them, are left alone.
StatusOr<std::vector<MarkedBuffer>> MarkMxFp8(const SavedInputView& view) {
  if (Status s = CheckMaxTokens(view); !s.ok()) return s;
  if (view.max_tokens % kScaleInvBlockTokens != 0) {
    return InvalidArgumentError(
        "max_tokens = " + Str(view.max_tokens) + " is not a multiple of " +
        Str(kScaleInvBlockTokens) +
        ": an MXFP8 columnwise_scale_inv holds one row per 32 tokens, so the token budget must be "
        "padded to 32 (router padding for quantization)");
  }
  if (view.columnwise_data.absent()) return MissingColumnwise("columnwise_data");
  if (view.columnwise_scale_inv.absent()) return MissingColumnwise("columnwise_scale_inv");
  if (Status s = CheckPresentBuffer(view.columnwise_data, "columnwise_data"); !s.ok()) return s;
  if (Status s = CheckPresentBuffer(view.columnwise_scale_inv, "columnwise_scale_inv"); !s.ok()) {
    return s;
  }
  const DType data_dtype = view.columnwise_data.dtype;
  if (data_dtype != DType::kFloat8E4M3 && data_dtype != DType::kFloat8E5M2 &&
      data_dtype != DType::kUInt8) {
    return InvalidArgumentError(std::string("columnwise_data.dtype is ") + DTypeName(data_dtype) +
                                ": MXFP8 data is float8_e4m3fn or float8_e5m2 (uint8 as TE "
                                "stores it); a high-precision input is not MXFP8 storage");
  }
  const DType scale_dtype = view.columnwise_scale_inv.dtype;
  if (scale_dtype != DType::kFloat8E8M0 && scale_dtype != DType::kUInt8) {
    return InvalidArgumentError(std::string("columnwise_scale_inv.dtype is ") +
                                DTypeName(scale_dtype) +
                                ": MXFP8 scales are float8_e8m0fnu (uint8 as TE stores them)");
  }
  StatusOr<MarkedBuffer> data =
      Mark(view.columnwise_data, "columnwise_data", BufferRole::kColumnwiseData, view.max_tokens);
  if (!data.ok()) return data.status();
  // Each token's row is the hidden dimension, which MXFP8 quantizes in 32-value blocks.
  if (data->row_bytes % kScaleInvBlockTokens != 0) {
    return InvalidArgumentError(
        "columnwise_data rows are " + Str(data->row_bytes) +
        " bytes, but MXFP8 needs the hidden size to be a multiple of 32 values: check max_tokens "
        "and columnwise_data.bytes");
  }
  StatusOr<MarkedBuffer> scale = Mark(view.columnwise_scale_inv, "columnwise_scale_inv",
                                      BufferRole::kColumnwiseScaleInv, view.max_tokens);
  if (!scale.ok()) return scale.status();
  return std::vector<MarkedBuffer>{*data, *scale};
}

}  // namespace

uint32_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kFloat8E8M0:
    case DType::kUInt8:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    case DType::kFloat8E4M3:
      return "float8_e4m3fn";
    case DType::kFloat8E5M2:
      return "float8_e5m2";
    case DType::kFloat8E8M0:
      return "float8_e8m0fnu";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

bool IsFloat8(DType dtype) {
  return dtype == DType::kFloat8E4M3 || dtype == DType::kFloat8E5M2 || dtype == DType::kFloat8E8M0;
}

SavedInputView SavedInputView::Absent() { return SavedInputView{}; }

SavedInputView SavedInputView::Plain(uint64_t max_tokens, BufferView tensor) {
  SavedInputView v;
  v.kind = SavedKind::kPlain;
  v.max_tokens = max_tokens;
  v.plain = tensor;
  return v;
}

SavedInputView SavedInputView::UnquantizedGrouped(uint64_t max_tokens, BufferView rowwise_data) {
  SavedInputView v;
  v.kind = SavedKind::kGrouped;
  v.max_tokens = max_tokens;
  v.mxfp8 = false;
  v.rowwise_data = rowwise_data;
  return v;
}

SavedInputView SavedInputView::MxFp8Grouped(uint64_t max_tokens, BufferView columnwise_data,
                                            BufferView columnwise_scale_inv) {
  SavedInputView v;
  v.kind = SavedKind::kGrouped;
  v.max_tokens = max_tokens;
  v.mxfp8 = true;
  v.columnwise_data = columnwise_data;
  v.columnwise_scale_inv = columnwise_scale_inv;
  return v;
}

const char* BufferRoleName(BufferRole role) {
  switch (role) {
    case BufferRole::kData:
      return "data";
    case BufferRole::kColumnwiseData:
      return "columnwise_data";
    case BufferRole::kColumnwiseScaleInv:
      return "columnwise_scale_inv";
  }
  return "unknown";
}

bool TeMarkerValue(BufferRole role) { return role == BufferRole::kColumnwiseScaleInv; }

uint32_t RowDivisor(BufferRole role) {
  return role == BufferRole::kColumnwiseScaleInv ? kScaleInvBlockTokens : 1;
}

StatusOr<std::vector<MarkedBuffer>> MarkedBuffers(const SavedInputView& view) {
  switch (view.kind) {
    case SavedKind::kAbsent:
      return std::vector<MarkedBuffer>{};
    case SavedKind::kPlain:
      return MarkPlain(view);
    case SavedKind::kGrouped:
      return view.mxfp8 ? MarkMxFp8(view) : MarkUnquantized(view);
  }
  return InvalidArgumentError("kind = " + Str(static_cast<uint32_t>(view.kind)) +
                              " is not a SavedKind value (kAbsent, kPlain or kGrouped)");
}

uint64_t ValidRows(int64_t count, uint32_t divisor) {
  if (count <= 0 || divisor == 0) return 0;
  return (static_cast<uint64_t>(count) + divisor - 1) / divisor;
}

}  // namespace stash
