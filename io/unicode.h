// The Unicode character classes and mappings of BERT's basic tokenizer, as Python's unicodedata and
// str.lower() give them (Hugging Face's BasicTokenizer, Google's tokenization.py), for every code
// point of the Unicode version the tables were generated from (scripts/gen-unicode-tables writes
// io/unicode_tables.inc; kUnicodeVersion names it).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::io::unicode {

extern const char* const kUnicodeVersion;

// Dropped by the cleaner: NUL, U+FFFD and category C* (Cc, Cf, Cs, Co, Cn) except \t \n \r.
bool is_control(char32_t c);
// A word boundary: " \t\n\r", category Zs, and U+2028/2029 (Python's str.split splits there too).
bool is_whitespace(char32_t c);
// A token of its own: the ASCII symbols (33-47, 58-64, 91-96, 123-126) and category P*.
bool is_punctuation(char32_t c);
// BERT's "Chinese character": the CJK Unified Ideographs blocks and the compatibility ideographs.
bool is_chinese_char(char32_t c);
// Category Mn: what accent stripping drops after NFD.
bool is_nonspacing_mark(char32_t c);

// is_control, is_whitespace and is_punctuation of an ASCII character (c < 0x80) by one lookup: the
// tokenizer asks them of every character, and nearly all of an English corpus is ASCII (the test
// "unicode: the ASCII class table" checks it against the tables).
enum : uint8_t { kAsciiControl = 1, kAsciiWhitespace = 2, kAsciiPunctuation = 4 };
inline constexpr std::array<uint8_t, 128> kAsciiClass = [] {
  std::array<uint8_t, 128> t{};
  for (char32_t c = 0; c < 128; ++c) {
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    if ((c < 0x20 && !space) || c == 0x7F) t[c] = kAsciiControl;
    if (space) t[c] = kAsciiWhitespace;
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))
      t[c] = kAsciiPunctuation;
  }
  return t;
}();

// Python's str.lower() of `s`: full case mapping (U+0130 becomes "i" + U+0307) and the capital sigma
// as ς where it ends a word (the Final_Sigma context), σ elsewhere.
std::u32string to_lower(std::u32string_view s);
void to_lower(std::u32string_view s, std::u32string* out);  // into *out (cleared first), reusing its memory
// Canonical decomposition (NFD): full decompositions, Hangul syllables into their jamo, then the
// combining marks in canonical order.
std::u32string nfd(std::u32string_view s);
void nfd(std::u32string_view s, std::u32string* out);  // into *out (cleared first), reusing its memory

}  // namespace kiln::io::unicode
