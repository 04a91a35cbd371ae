// IDX files (the MNIST format): a magic of two zero bytes, a type byte and a rank byte, big-endian
// u32 dims, then the big-endian data. Read plain or gzip-compressed, validated in full.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/tensor.h"

namespace kiln::io {

// Reads `path` (gzip or plain, detected from the bytes). u8 data gives a u8 tensor, i8/i16/i32 an
// i32 tensor, f32 and f64 their own. A wrong magic, an unknown type code, a truncated file or
// trailing bytes are errors naming the file and what was expected.
// With `rank` > 0, a file of another rank is an error saying `expected` ("a 1-D labels file ...")
// before its dims are read (an images file given for the labels named its dims as too many elements).
Tensor load_idx(const std::string& path, int rank = 0, const std::string& expected = "");
// The same from bytes in memory (tests, fuzzing); `what` names the source in errors.
Tensor parse_idx(const uint8_t* data, size_t size, const std::string& what, int rank = 0,
                 const std::string& expected = "");

// The whole file, gunzipped when it is gzip (or plain as it is). Errors name the file.
std::string read_maybe_gzip(const std::string& path);

}  // namespace kiln::io
