// BERT text processing. The basic tokenizer follows BERT's step by step, with the Unicode classes and
// mappings of io/unicode.h.
#include "io/text.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <unordered_set>

#include "engine/random.h"
#include "io/atomic_file.h"
#include "io/idx.h"
#include "io/unicode.h"

namespace kiln::io {

// ---- UTF-8 ---------------------------------------------------------------------------------------

namespace {
// decode_utf8, counting in `bad` the bytes it could not decode (each became U+FFFD).
// With keep false nothing is kept (the count alone: a 30 MB file's check held 120 MB of code points).
std::u32string decode_utf8_counting(std::string_view s, int64_t* bad, bool keep = true) {
  std::u32string out;
  if (keep) out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    char32_t cp = len == 1 ? b : len == 2 ? b & 0x1F : len == 3 ? b & 0x0F : b & 0x07;
    bool ok = len > 0 && i + size_t(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + size_t(k)]);
      ok = (c >> 6) == 2;
      cp = cp << 6 | (c & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are malformed too.
    ok = ok && !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) &&
         !(cp >= 0xD800 && cp <= 0xDFFF);
    if (ok) {
      if (keep) out.push_back(cp);
      i += size_t(len);
    } else {
      if (keep) out.push_back(0xFFFD);
      i += 1;
      if (bad) ++*bad;
    }
  }
  return out;
}

// The tokenizer drops U+FFFD as BERT's does, so bytes that are not UTF-8 vanish from the words
// ("café" in Latin-1 trains as "caf"): said once per file, with the count; never fatal.
void warn_invalid_utf8(const std::string& path, std::string_view text) {
  int64_t bad = 0;
  (void)decode_utf8_counting(text, &bad, /*keep=*/false);
  if (bad)
    std::fprintf(stderr,
                 "kiln: warning: %s: %lld bytes are not valid UTF-8 and are left out of its words (a Latin-1 file? "
                 "convert it with `iconv -f latin1 -t utf-8`)\n",
                 path.c_str(), (long long)bad);
}
}  // namespace

std::u32string decode_utf8(std::string_view s) { return decode_utf8_counting(s, nullptr); }

std::vector<std::string_view> split_lines(std::string_view text) {
  // A lone "\r" ends a line only in a file without any "\n" (old Mac files); elsewhere it is content
  // (a "\r" inside a field must not cut a row in two), and "\r\n" is one line end.
  const char end = text.find('\n') == std::string_view::npos ? '\r' : '\n';
  std::vector<std::string_view> lines;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != end) continue;
    size_t len = i - start;
    if (end == '\n' && len > 0 && text[i - 1] == '\r') --len;
    lines.push_back(text.substr(start, len));
    start = i + 1;
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

size_t binary_offset(std::string_view text) { return text.substr(0, kBinaryHead).find('\0'); }

size_t file_binary_offset(const std::string& path) {
  auto raw_head = [&] {
    std::ifstream f(path, std::ios::binary);
    std::string head(kBinaryHead, '\0');
    f.read(head.data(), std::streamsize(head.size()));
    head.resize(size_t(f.gcount()));
    return binary_offset(head);
  };
  gzFile f = gzopen(path.c_str(), "rb");  // zlib reads plain files through the same calls
  if (f == nullptr) return raw_head();
  std::unique_ptr<gzFile_s, int (*)(gzFile)> guard(f, gzclose);
  std::string head(kBinaryHead, '\0');
  size_t got = 0;
  while (got < head.size()) {
    const int n = gzread(f, head.data() + got, unsigned(head.size() - got));
    if (n < 0) return raw_head();  // gzip's magic but no deflate stream: judged on its bytes
    if (n == 0) break;
    got += size_t(n);
  }
  head.resize(got);
  return binary_offset(head);
}

std::string read_text_file(const std::string& path) {
  std::string text = read_maybe_gzip(path);
  const size_t nul = binary_offset(text);
  KILN_CHECK(nul == std::string::npos, path, ": binary data (a NUL byte at offset ", nul, "), not a text file");
  // A UTF-8 byte order mark (Windows editors write one) is dropped here, for every text file: it is no
  // part of a vocabulary's "[PAD]", a TSV header or a corpus's first word.
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  warn_invalid_utf8(path, text);
  return text;
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) {
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xC0 | (c >> 6));
      out += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += char(0xE0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    } else {
      out += char(0xF0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3F));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    }
  }
  return out;
}

// ---- basic tokenizer -----------------------------------------------------------------------------

namespace {
// Appends c to `out` as UTF-8.
void append_utf8(std::string* out, char32_t c) {
  if (c < 0x80) {
    *out += char(c);
  } else if (c < 0x800) {
    *out += char(0xC0 | (c >> 6));
    *out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    *out += char(0xE0 | (c >> 12));
    *out += char(0x80 | ((c >> 6) & 0x3F));
    *out += char(0x80 | (c & 0x3F));
  } else {
    *out += char(0xF0 | (c >> 18));
    *out += char(0x80 | ((c >> 12) & 0x3F));
    *out += char(0x80 | ((c >> 6) & 0x3F));
    *out += char(0x80 | (c & 0x3F));
  }
}

bool is_punctuation(char32_t c) {
  return c < 0x80 ? unicode::kAsciiClass[c] & unicode::kAsciiPunctuation : unicode::is_punctuation(c);
}

// The buffers of split_word, kept from word to word of a text so that a word allocates only its tokens.
struct WordScratch {
  std::u32string lower, decomposed;
  std::string piece;
};

// One whitespace-separated word of the cleaned text: lower-cased (str.lower()), then accents stripped
// (NFD, category Mn dropped), then split at each punctuation mark, in BERT's order. An all-ASCII word
// (`ascii`) takes a short cut with the same result: str.lower() of ASCII is A-Z to a-z, and it has
// neither decompositions nor marks.
void split_word(std::u32string_view word, bool ascii, const BasicTokenizerOptions& o, WordScratch* s,
                std::vector<std::string>* out) {
  std::string& piece = s->piece;
  piece.clear();
  if (ascii) {
    for (const char32_t c : word) {
      if (unicode::kAsciiClass[c] & unicode::kAsciiPunctuation) {
        if (!piece.empty()) out->push_back(piece);
        piece.clear();
        out->emplace_back(1, char(c));
      } else {
        piece += char(o.lower_case && c >= 'A' && c <= 'Z' ? c + 32 : c);
      }
    }
    if (!piece.empty()) out->push_back(piece);
    return;
  }
  if (o.lower_case) {
    unicode::to_lower(word, &s->lower);
    word = s->lower;
  }
  if (o.strip_accents) {
    unicode::nfd(word, &s->decomposed);
    word = s->decomposed;
  }
  for (const char32_t c : word) {
    // Dropping the marks first, then splitting, as BERT does, is this one pass: no mark (Mn) is
    // punctuation (P*).
    if (o.strip_accents && c >= 0x80 && unicode::is_nonspacing_mark(c)) continue;
    if (!is_punctuation(c)) {
      append_utf8(&piece, c);
      continue;
    }
    if (!piece.empty()) out->push_back(piece);
    piece.clear();
    append_utf8(&piece, c);
    out->push_back(piece);
    piece.clear();
  }
  if (!piece.empty()) out->push_back(piece);
}
}  // namespace

namespace {
// basic_tokenize's words, each given to on_word as it is found, until on_word returns false: a text
// is read only as far as its caller needs (a TSV line of 30 MB cut to --seq-len tokens took seconds
// and a gigabyte, every word of it held as a string).
template <class OnWord> void each_basic_token(std::string_view text, const BasicTokenizerOptions& o, OnWord&& on_word) {
  std::vector<std::string> out;  // the words of one whitespace-separated word, or a special token
  bool stopped = false;
  auto give = [&] {
    for (std::string& w : out)
      if (!on_word(w)) {
        stopped = true;
        break;
      }
    out.clear();
  };
  std::u32string word;
  bool ascii = true;  // word holds only ASCII
  WordScratch scratch;
  auto flush = [&] {
    if (!word.empty()) split_word(word, ascii, o, &scratch, &out);
    word.clear();
    ascii = true;
    give();
  };
  // Cleaning (controls dropped), CJK ideographs made words of their own, split at whitespace. ASCII
  // bytes are read as they are; each run of other bytes is decoded on its own, which decodes as the
  // whole text would (no ASCII byte is part of a multi-byte character, and a sequence cut short by
  // one is malformed either way), in pieces of about 4 KiB cut where no character can span the cut:
  // before a byte that is not a continuation byte, or after three that are.
  auto read_part = [&](std::string_view part) {
    for (size_t i = 0; i < part.size() && !stopped;) {
      const auto b = static_cast<unsigned char>(part[i]);
      if (b < 0x80) {
        const uint8_t k = unicode::kAsciiClass[b];
        if (k & unicode::kAsciiWhitespace)
          flush();
        else if (!(k & unicode::kAsciiControl))
          word.push_back(b);
        ++i;
        continue;
      }
      size_t j = i;
      while (j < part.size() && j - i < 4096 && static_cast<unsigned char>(part[j]) >= 0x80) ++j;
      for (int k = 0; k < 3 && j < part.size() && (static_cast<unsigned char>(part[j]) >> 6) == 2; ++k) ++j;
      for (const char32_t c : decode_utf8(part.substr(i, j - i))) {
        if (stopped) break;
        if (unicode::is_control(c)) continue;
        if (unicode::is_whitespace(c)) {
          flush();
        } else if (unicode::is_chinese_char(c)) {
          flush();
          word.push_back(c);
          ascii = false;
          flush();
        } else {
          word.push_back(c);
          ascii = false;
        }
      }
      i = j;
    }
    if (!stopped) flush();
  };
  // The special tokens a text may hold, kept whole as BERT's tokenizer keeps its never_split/added
  // tokens: found as written (case-sensitive) anywhere in the text, before any cleaning; the text
  // between them is read as above.
  for (size_t start = 0; !stopped;) {
    size_t at = start;
    const std::string* special = nullptr;
    for (; at < text.size() && special == nullptr; ++at) {
      if (text[at] != '[') continue;
      for (const std::string& t : kBertSpecialTokens)
        if (text.compare(at, t.size(), t) == 0) {
          special = &t;
          break;
        }
    }
    if (special != nullptr) --at;  // the loop stepped past it
    read_part(text.substr(start, at - start));
    if (stopped || special == nullptr) break;
    out.push_back(*special);
    give();
    start = at + special->size();
  }
}
}  // namespace

std::vector<std::string> basic_tokenize(std::string_view text, const BasicTokenizerOptions& o) {
  std::vector<std::string> out;
  each_basic_token(text, o, [&out](std::string& w) {
    out.push_back(std::move(w));
    return true;
  });
  return out;
}

// ---- vocabulary ----------------------------------------------------------------------------------

Vocab Vocab::from_tokens(std::vector<std::string> tokens, std::string source) {
  Vocab v;
  v.source_ = std::move(source);
  KILN_CHECK(!tokens.empty(), v.source_, ": the vocabulary is empty");
  for (size_t i = 0; i < tokens.size(); ++i) {
    KILN_CHECK(!tokens[i].empty(), v.source_, ": token ", i, " (line ", i + 1, ") is empty");
    const bool fresh = v.ids_.emplace(tokens[i], int64_t(i)).second;
    KILN_CHECK(fresh, v.source_, ": token '", tokens[i], "' appears twice (lines ", v.ids_.at(tokens[i]) + 1, " and ",
               i + 1, ")");
  }
  v.tokens_ = std::move(tokens);
  return v;
}

Vocab Vocab::load(const std::string& path) {
  KILN_CHECK(std::ifstream(path, std::ios::binary).good(), path, ": cannot open the vocabulary");
  const std::string text = read_text_file(path);  // without its byte order mark
  std::vector<std::string> tokens;
  for (const std::string_view line : split_lines(text)) tokens.emplace_back(line);
  // Blank lines at the end are no tokens (editors and `echo >>` leave them; Hugging Face loads such a
  // file too, with one empty token more at the end, so the ids of the real tokens agree); a blank line before a token
  // stays an error (it would shift every id after it).
  while (!tokens.empty() && tokens.back().empty()) tokens.pop_back();
  // A token holding whitespace can never match: the tokenizer splits words there. Hugging Face's
  // BertTokenizer keeps such a line as a token too (its ids stay as the file numbers them), so it is
  // said, not refused.
  int64_t spaced = 0, first = -1;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i].find_first_of(" \t\v\f") != std::string::npos) {
      if (first < 0) first = int64_t(i);
      ++spaced;
    }
  if (spaced > 0)
    std::fprintf(stderr,
                 "kiln: warning: %s:%lld: the token '%s' holds whitespace, which no word of a text can (the "
                 "tokenizer splits words there): it never matches%s\n",
                 path.c_str(), (long long)first + 1, tokens[size_t(first)].c_str(),
                 spaced > 1 ? (" (nor do the " + std::to_string(spaced - 1) + " other such tokens)").c_str() : "");
  return from_tokens(std::move(tokens), path);
}

void Vocab::save(const std::string& path) const {
  std::string text;
  for (const auto& t : tokens_) text += t + '\n';
  write_file_atomic(path, text);
}

int64_t Vocab::id(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

const std::string& Vocab::token(int64_t id) const {
  KILN_CHECK(id >= 0 && id < size(), source_, ": token id ", id, " is outside the vocabulary of ", size());
  return tokens_[size_t(id)];
}

int64_t Vocab::require(const std::string& token, const std::string& why) const {
  const int64_t i = id(token);
  KILN_CHECK(i >= 0, source_, ": the vocabulary has no ", token, " token, which ", why);
  return i;
}

// ---- WordPiece -----------------------------------------------------------------------------------

WordPieceTokenizer::WordPieceTokenizer(Vocab vocab, BasicTokenizerOptions o, int64_t max_chars_per_word)
    : vocab_(std::move(vocab)), o_(o), max_chars_(max_chars_per_word) {
  unk_id = vocab_.id("[UNK]");
  pad_id = vocab_.id("[PAD]");
  cls_id = vocab_.id("[CLS]");
  sep_id = vocab_.id("[SEP]");
  mask_id = vocab_.id("[MASK]");
  KILN_CHECK(unk_id >= 0, vocab_.source(), ": the vocabulary has no [UNK] token, which WordPiece needs for words it "
             "cannot split");
}

namespace {
// WordPiece of one basic word: its pieces appended to `out`, or "[UNK]" for a word with no
// segmentation or longer than max_chars code points.
void wordpiece(const std::string& word, const Vocab& vocab, int64_t max_chars, std::vector<std::string>* out) {
  const std::u32string cps = decode_utf8(word);
  if (int64_t(cps.size()) > max_chars) {
    out->push_back("[UNK]");
    return;
  }
  const size_t before = out->size();
  size_t start = 0;
  while (start < cps.size()) {
    size_t end = cps.size();
    std::string found;
    for (; end > start; --end) {
      std::string sub = (start > 0 ? "##" : "") + encode_utf8(cps.substr(start, end - start));
      if (vocab.id(sub) >= 0) {
        found = std::move(sub);
        break;
      }
    }
    if (found.empty()) {
      out->resize(before);
      out->push_back("[UNK]");
      return;
    }
    out->push_back(std::move(found));
    start = end;
  }
}
}  // namespace

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text, size_t max_tokens) const {
  std::vector<std::string> out;
  if (max_tokens == 0) return out;
  // Each word gives at least one token: the words after the max_tokens-th cannot change the first
  // max_tokens tokens, and are not read.
  each_basic_token(text, o_, [&](const std::string& word) {
    wordpiece(word, vocab_, max_chars_, &out);
    return out.size() < max_tokens;
  });
  if (out.size() > max_tokens) out.resize(max_tokens);
  return out;
}

std::vector<int64_t> WordPieceTokenizer::encode(std::string_view text, size_t max_tokens) const {
  std::vector<int64_t> ids;
  for (const auto& t : tokenize(text, max_tokens)) ids.push_back(t == "[UNK]" ? unk_id : vocab_.id(t));
  return ids;
}

size_t WordPieceTokenizer::count(std::string_view text, size_t max_tokens) const {
  size_t n = 0;
  std::vector<std::string> pieces;
  if (max_tokens == 0) return 0;
  each_basic_token(text, o_, [&](const std::string& word) {
    pieces.clear();
    wordpiece(word, vocab_, max_chars_, &pieces);
    n += pieces.size();
    return n < max_tokens;
  });
  return std::min(n, max_tokens);
}

std::string WordPieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (int64_t id : ids) {
    const std::string& t = vocab_.token(id);
    if (t.rfind("##", 0) == 0 && !s.empty()) {
      s += t.substr(2);
    } else {
      if (!s.empty()) s += ' ';
      s += t;
    }
  }
  return s;
}

// ---- vocabulary builder --------------------------------------------------------------------------

Vocab build_wordpiece_vocab(const std::vector<std::string>& files, int64_t size, const BasicTokenizerOptions& o,
                            int64_t min_frequency) {
  KILN_CHECK(size > int64_t(kBertSpecialTokens.size()), "vocabulary size ", size, " leaves no room beside the ",
             kBertSpecialTokens.size(), " special tokens");
  KILN_CHECK(!files.empty(), "build_wordpiece_vocab: no text files");
  std::map<std::string, int64_t> word_freq;
  for (const auto& f : files) {
    const std::string text = read_text_file(f);
    for (auto& w : basic_tokenize(text, o))
      if (decode_utf8(w).size() <= 100 &&
          std::find(kBertSpecialTokens.begin(), kBertSpecialTokens.end(), w) == kBertSpecialTokens.end())
        ++word_freq[w];  // a special token written in the text is in the vocabulary already
  }
  KILN_CHECK(!word_freq.empty(), "build_wordpiece_vocab: no words in ", files.front(), files.size() > 1 ? " ..." : "");

  // Symbols: strings; words: sequences of symbol ids with their frequency.
  std::vector<std::string> sym;
  std::unordered_map<std::string, int> sym_id;
  auto intern = [&](const std::string& s) {
    auto [it, fresh] = sym_id.emplace(s, int(sym.size()));
    if (fresh) sym.push_back(s);
    return it->second;
  };
  std::vector<std::vector<int>> words;
  std::vector<int64_t> freq;
  std::map<std::string, int64_t> char_freq;
  for (const auto& [w, f] : word_freq) {
    const std::u32string cps = decode_utf8(w);
    std::vector<int> ids;
    for (size_t i = 0; i < cps.size(); ++i) {
      const std::string piece = (i ? "##" : "") + encode_utf8(cps.substr(i, 1));
      ids.push_back(intern(piece));
      char_freq[piece] += f;
    }
    words.push_back(std::move(ids));
    freq.push_back(f);
  }
  std::vector<std::string> vocab = kBertSpecialTokens;
  // The alphabet, most frequent first, so a small size keeps the common characters.
  std::vector<std::pair<int64_t, std::string>> alphabet;
  for (const auto& [p, f] : char_freq) alphabet.push_back({-f, p});
  std::sort(alphabet.begin(), alphabet.end());
  for (const auto& [f, p] : alphabet)
    if (int64_t(vocab.size()) < size) vocab.push_back(p);

  auto key = [](int a, int b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); };
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::unordered_set<int>> pair_words;
  auto merged = [&](int a, int b) { return sym[size_t(a)] + (sym[size_t(b)].rfind("##", 0) == 0 ? sym[size_t(b)].substr(2) : sym[size_t(b)]); };
  struct Entry {
    int64_t count;
    std::string merged;
    int a, b;
    bool operator<(const Entry& o) const {  // max-heap: highest count, then the smallest string
      return count != o.count ? count < o.count : merged > o.merged;
    }
  };
  std::priority_queue<Entry> heap;
  auto add_word_pairs = [&](int w, int64_t sign, std::set<uint64_t>* touched) {
    const auto& s = words[size_t(w)];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = key(s[i], s[i + 1]);
      pair_count[k] += sign * freq[size_t(w)];
      if (sign > 0) pair_words[k].insert(w);
      if (touched) touched->insert(k);
    }
  };
  for (int w = 0; w < int(words.size()); ++w) add_word_pairs(w, 1, nullptr);
  for (const auto& [k, c] : pair_count) heap.push({c, merged(int(k >> 32), int(uint32_t(k))), int(k >> 32), int(uint32_t(k))});

  std::unordered_set<std::string> in_vocab(vocab.begin(), vocab.end());
  while (int64_t(vocab.size()) < size && !heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    const uint64_t k = key(e.a, e.b);
    auto it = pair_count.find(k);
    if (it == pair_count.end() || it->second != e.count) continue;  // stale
    if (e.count < min_frequency) break;
    const int c = intern(e.merged);
    if (in_vocab.insert(e.merged).second) vocab.push_back(e.merged);
    std::set<uint64_t> touched;
    const std::unordered_set<int> ws = pair_words[k];
    for (int w : ws) {
      add_word_pairs(w, -1, &touched);
      auto& s = words[size_t(w)];
      std::vector<int> t;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == e.a && s[i + 1] == e.b) {
          t.push_back(c);
          ++i;
        } else {
          t.push_back(s[i]);
        }
      }
      s = std::move(t);
      add_word_pairs(w, 1, &touched);
    }
    pair_words.erase(k);
    for (uint64_t t : touched) {
      const int64_t cnt = pair_count[t];
      if (cnt > 0) heap.push({cnt, merged(int(t >> 32), int(uint32_t(t))), int(t >> 32), int(uint32_t(t))});
    }
  }
  return Vocab::from_tokens(std::move(vocab), "built vocabulary");
}

// ---- masked-LM corpus ----------------------------------------------------------------------------

MlmDataset::MlmDataset(std::shared_ptr<const WordPieceTokenizer> tok, const std::vector<std::string>& files,
                       MlmOptions o)
    : tok_(std::move(tok)), o_(o) {
  const Vocab& v = tok_->vocab();
  v.require("[CLS]", "masked-LM sequences start with");
  v.require("[SEP]", "masked-LM sequences end with");
  v.require("[PAD]", "pads short masked-LM sequences");
  v.require("[MASK]", "masked-LM training puts in place of the hidden tokens");
  KILN_CHECK(o_.seq_len >= 8, "masked-LM sequence length must be at least 8, got ", o_.seq_len);
  KILN_CHECK(o_.mask_prob > 0 && o_.mask_prob < 1, "mask probability must be in (0, 1), got ", o_.mask_prob);
  KILN_CHECK(!files.empty(), "masked-LM: no text files");
  const size_t room = size_t(o_.seq_len - 2);
  std::vector<int32_t> cur;
  auto emit = [&] {
    if (cur.empty()) return;
    std::vector<int32_t> s;
    s.reserve(cur.size() + 2);
    s.push_back(int32_t(tok_->cls_id));
    s.insert(s.end(), cur.begin(), cur.end());
    s.push_back(int32_t(tok_->sep_id));
    tokens_ += int64_t(cur.size());
    seqs_.push_back(std::move(s));
    cur.clear();
  };
  for (const auto& f : files) {
    const std::string text = read_text_file(f);
    for (const std::string_view line : split_lines(text)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos || line == "%") {
        emit();  // end of a document
        continue;
      }
      const std::vector<int64_t> ids = tok_->encode(line);
      if (cur.size() + ids.size() > room) emit();
      for (int64_t id : ids) {
        if (cur.size() == room) emit();  // a line longer than a sequence continues in the next
        cur.push_back(int32_t(id));
      }
    }
    emit();
  }
  KILN_CHECK(!seqs_.empty(), "masked-LM: no text in ", files.front(), files.size() > 1 ? " ..." : "");
}

std::shared_ptr<MlmDataset> MlmDataset::subset(int64_t from, int64_t to) const {
  KILN_CHECK(from >= 0 && from <= to && to <= size(), "masked-LM subset [", from, ", ", to, ") of ", size(), " sequences");
  auto d = std::shared_ptr<MlmDataset>(new MlmDataset());
  d->tok_ = tok_;
  d->o_ = o_;
  d->seqs_.assign(seqs_.begin() + from, seqs_.begin() + to);
  for (const auto& s : d->seqs_) d->tokens_ += int64_t(s.size()) - 2;
  return d;
}

namespace {
Batch text_batch(int64_t b, int64_t len, int64_t pad_id) {
  Batch out;
  out["input_ids"] = make_tensor({b, len}, DType::i64, kCPU);
  out["attention_mask"] = make_tensor({b, len}, DType::i64, kCPU);
  out["token_type_ids"] = make_tensor({b, len}, DType::i64, kCPU);
  std::fill_n(out["input_ids"].data<int64_t>(), b * len, pad_id);
  std::fill_n(out["attention_mask"].data<int64_t>(), b * len, 0);
  std::fill_n(out["token_type_ids"].data<int64_t>(), b * len, 0);
  return out;
}
}  // namespace

Batch MlmDataset::get_batch(const std::vector<int64_t>& indices, uint64_t seed) const {
  const int64_t b = int64_t(indices.size()), len = o_.seq_len, vocab = tok_->vocab().size();
  Batch out = text_batch(b, len, tok_->pad_id);
  Tensor labels = make_tensor({b, len}, DType::i64, kCPU);
  std::fill_n(labels.data<int64_t>(), b * len, -100);
  int64_t* ids = out["input_ids"].data<int64_t>();
  int64_t* mask = out["attention_mask"].data<int64_t>();
  int64_t* lab = labels.data<int64_t>();
  const float p = float(o_.mask_prob);
  // The vocab's special tokens are never targets, as in Hugging Face's DataCollatorForLanguageModeling
  // (its special-tokens mask holds [UNK] too: predicting "unknown" teaches nothing). Written in the
  // text, [SEP] or [MASK] are special tokens in the middle of a sequence as well.
  const auto special_id = [this](int64_t t) {
    return t == tok_->unk_id || t == tok_->cls_id || t == tok_->sep_id || t == tok_->pad_id || t == tok_->mask_id;
  };
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = indices[size_t(i)];
    KILN_CHECK(n >= 0 && n < size(), "masked-LM: sample ", n, " out of range [0, ", size(), ")");
    const auto& s = seqs_[size_t(n)];
    PhiloxStream rng(seed, uint64_t(n) << 16);
    for (size_t j = 0; j < s.size(); ++j) {
      int64_t t = s[j];
      mask[i * len + int64_t(j)] = 1;
      const bool special = j == 0 || j + 1 == s.size() || special_id(t);
      // Three draws per position whether or not it is masked: the stream stays aligned with positions.
      const float u = rng.uniform(), r = rng.uniform();
      const uint64_t rand_tok = rng.below(uint64_t(vocab));
      if (!special && u < p) {
        lab[i * len + int64_t(j)] = t;
        if (r < 0.8f) t = tok_->mask_id;
        else if (r < 0.9f) t = int64_t(rand_tok);
      }
      ids[i * len + int64_t(j)] = t;
    }
    // A sequence with nothing masked would teach nothing and could leave a batch without a target:
    // mask one of its tokens, drawn from the same stream (so the rate is above mask_prob on short
    // sequences), not a special token unless the sequence holds nothing else.
    bool any = false;
    for (size_t j = 0; j < s.size(); ++j) any = any || lab[i * len + int64_t(j)] != -100;
    if (!any && s.size() > 2) {
      std::vector<int64_t> known;
      for (size_t j = 1; j + 1 < s.size(); ++j)
        if (!special_id(s[j])) known.push_back(int64_t(j));
      const int64_t j = known.empty() ? 1 + int64_t(rng.below(uint64_t(s.size() - 2)))
                                      : known[size_t(rng.below(uint64_t(known.size())))];
      const float r = rng.uniform();
      const uint64_t rand_tok = rng.below(uint64_t(vocab));
      lab[i * len + j] = s[size_t(j)];
      if (r < 0.8f) ids[i * len + j] = tok_->mask_id;
      else if (r < 0.9f) ids[i * len + j] = int64_t(rand_tok);
    }
  }
  out["labels"] = labels;
  return out;
}

// ---- TSV classification --------------------------------------------------------------------------

std::pair<size_t, size_t> longest_first(size_t a, size_t b, size_t room) {
  if (a + b <= room) return {a, b};
  // As the Rust tokenizers: n1 the shorter, n2 the longer; the longer alone cut while that is enough.
  const bool swap = a > b;
  size_t n1 = std::min(a, b), n2 = std::max(n1, n1 > room ? n1 : room - n1);
  if (n1 + n2 > room) {
    n1 = room / 2;
    n2 = n1 + room % 2;
  }
  if (swap) std::swap(n1, n2);
  return {std::min(a, n1), std::min(b, n2)};
}

TsvClassificationDataset::TsvClassificationDataset(std::shared_ptr<const WordPieceTokenizer> tok,
                                                   const std::string& path, int64_t seq_len,
                                                   std::vector<std::string> label_names)
    : tok_(std::move(tok)), seq_len_(seq_len), labels_(std::move(label_names)) {
  tok_->vocab().require("[CLS]", "classification inputs start with");
  tok_->vocab().require("[SEP]", "classification inputs end with");
  tok_->vocab().require("[PAD]", "pads short classification inputs");
  KILN_CHECK(seq_len_ >= 3, "classification sequence length must be at least 3, got ", seq_len_);
  const std::string text = read_text_file(path);

  // Rows of tab-separated fields with their line numbers; blank lines (empty or only spaces and
  // tabs) are skipped.
  struct Row {
    int64_t line;
    std::string_view text;                 // the whole line
    std::vector<std::string_view> fields;  // views into `text`
  };
  std::vector<Row> rows;
  {
    const std::vector<std::string_view> lines = split_lines(text);
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string_view l = lines[i];
      if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      Row r{int64_t(i + 1), l, {}};
      for (size_t start = 0;;) {
        const size_t tab = l.find('\t', start);
        r.fields.push_back(l.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start));
        if (tab == std::string_view::npos) break;
        start = tab + 1;
      }
      rows.push_back(std::move(r));
    }
  }
  KILN_CHECK(!rows.empty(), path, ": no label<TAB>text lines");
  auto trim = [](std::string_view v) {
    const size_t a = v.find_first_not_of(" \t\v\f\r");
    if (a == std::string_view::npos) return std::string_view();
    return v.substr(a, v.find_last_not_of(" \t\v\f\r") - a + 1);
  };
  auto lower = [&](std::string_view v) {
    std::string out(trim(v));
    for (char& ch : out) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return out;
  };
  auto shown = [](std::string_view v) {
    std::string out(1, '\'');
    out.append(v.substr(0, 60));
    out += v.size() > 60 ? "...'" : "'";
    return out;
  };

  // The first row is a header when one of its columns is named "label" (GLUE's SST-2 writes
  // sentence<TAB>label; GLUE's own files name it "Quality" (MRPC), "gold_label" (MNLI) or
  // "is_duplicate" (QQP), taken when no column is named "label"). The text is a sentence pair when
  // the header names one of GLUE's pairs (QNLI's question beside its sentence), else the column
  // named "sentence" or "text"; else the only other column, or the two other ones, in file order, a
  // pair (columns named id, idx or index are not text). Without a header: label<TAB>text, the text being the rest of
  // the line (tabs in it kept). With a header whose (last) text column is the last, a row with more fields than the
  // header has tabs in its text: they are kept too.
  constexpr size_t kNone = size_t(-1);
  size_t label_col = 0, text_col = 1, pair_col = kNone, columns = 2;
  std::string label_col_name = "column 1";
  const Row& first = rows.front();
  std::vector<std::string> names;
  for (const auto& f : first.fields) names.push_back(lower(f));
  auto label_it = std::find(names.begin(), names.end(), "label");
  for (const char* other : {"quality", "gold_label", "is_duplicate"})
    if (label_it == names.end()) label_it = std::find(names.begin(), names.end(), other);
  if (label_it != names.end()) {
    columns = names.size();
    label_col = size_t(label_it - names.begin());
    auto col = [&](const char* name) {
      const auto it = std::find(names.begin(), names.end(), name);
      return it == names.end() ? kNone : size_t(it - names.begin());
    };
    text_col = kNone;
    for (const auto& [a, b] :
         {std::pair{"sentence1", "sentence2"}, std::pair{"question", "sentence"}, std::pair{"question1", "question2"},
          std::pair{"premise", "hypothesis"}, std::pair{"#1 string", "#2 string"}})
      if (text_col == kNone && col(a) != kNone && col(b) != kNone) {
        text_col = col(a);
        pair_col = col(b);
      }
    if (text_col == kNone) text_col = col("sentence");
    if (text_col == kNone) text_col = col("text");
    std::vector<size_t> others;  // the columns that may hold text: not the label, not an id
    for (size_t i = 0; i < columns; ++i)
      if (i != label_col && names[i] != "id" && names[i] != "idx" && names[i] != "index") others.push_back(i);
    if (text_col == kNone && (others.size() == 1 || others.size() == 2)) {
      text_col = others[0];
      if (others.size() == 2) pair_col = others[1];
    }
    std::string all;
    for (const auto& f : first.fields) all += (all.empty() ? "" : ", ") + shown(f);
    KILN_CHECK(text_col != kNone, path, ":", first.line, ": the header (", all,
               ") names a label column but no text column: name that one 'sentence' or 'text', or a pair's "
               "'sentence1' and 'sentence2' (or give one or two columns beside the label)");
    text_columns_ = {std::string(trim(first.fields[text_col]))};
    if (pair_col != kNone) text_columns_.emplace_back(trim(first.fields[pair_col]));
    label_col_name =
        "column " + std::to_string(label_col + 1) + " (" + shown(trim(first.fields[label_col])) + " in the header)";
    rows.erase(rows.begin());
    KILN_CHECK(!rows.empty(), path, ": a header line and no label<TAB>text lines");
  }
  const bool header = label_it != names.end();
  // The text of a row's column: from the start of the column to the end of the line when it is the
  // last column (so its tabs are kept), else that column.
  auto text_of = [&](const Row& r, size_t col) {
    if (!header || col + 1 == columns) return r.text.substr(size_t(r.fields[col].data() - r.text.data()));
    return r.fields[col];
  };
  const bool text_last = text_col + 1 == columns || (pair_col != kNone && pair_col + 1 == columns);
  // Without a header, the same three or more columns on every line is a layout (GLUE's CoLA:
  // source<TAB>label<TAB><TAB>sentence), not tabs inside the text: taking column 1 as the label would
  // train on the wrong column without a word.
  if (!header && rows.front().fields.size() >= 3 && std::all_of(rows.begin(), rows.end(), [&](const Row& r) {
        return r.fields.size() == rows.front().fields.size();
      }))
    KILN_FAIL(path, ": every line has ", rows.front().fields.size(),
              " tab-separated columns and there is no header line: add one naming the 'label' column and the "
              "'sentence' (or 'text') column, or write label<TAB>text lines");
  for (const Row& r : rows) {
    const std::string_view l = r.fields.front();
    const bool ok =
        header ? r.fields.size() == columns || (r.fields.size() > columns && text_last) : r.fields.size() >= 2;
    KILN_CHECK(ok, path, ":", r.line, ": expected ",
               header ? std::to_string(columns) + " columns as the header" : std::string("label<TAB>text"), ", got ",
               r.fields.size() == 1 ? shown(l) : std::to_string(r.fields.size()) + " columns");
    KILN_CHECK(!trim(r.fields[label_col]).empty(), path, ":", r.line, ": the label (", label_col_name, ") is empty");
  }

  const bool fixed = !labels_.empty();
  if (!fixed) {
    std::set<std::string> distinct;
    for (const Row& r : rows) distinct.emplace(trim(r.fields[label_col]));
    // Many distinct labels over many rows may be text in the label column (text<TAB>label without a
    // header), or a data set with many classes (intents): said, not refused.
    if (rows.size() >= 20 && distinct.size() * 2 > rows.size())
      std::fprintf(stderr,
                   "kiln: warning: %s: %zu distinct labels in %zu rows, taking %s as the label: if that column "
                   "holds text, the file should hold label<TAB>text lines, or a header naming the 'label' column\n",
                   path.c_str(), distinct.size(), rows.size(), label_col_name.c_str());
    labels_.assign(distinct.begin(), distinct.end());
    // Integer labels (GLUE's 0/1, star ratings) in numeric order, so label "2" is class 2, not 10's
    // neighbour. The names travel with the weights, so a model evaluates in its own order.
    auto integer = [](const std::string& v) {
      const size_t digits = v[0] == '-' ? 1 : 0;
      return v.size() > digits && v.size() <= 18 && v.find_first_not_of("0123456789", digits) == std::string::npos;
    };
    if (std::all_of(labels_.begin(), labels_.end(), integer))
      std::stable_sort(labels_.begin(), labels_.end(),
                       [](const std::string& a, const std::string& b) { return std::stoll(a) < std::stoll(b); });
  }
  std::map<std::string, int64_t, std::less<>> label_id;
  for (size_t i = 0; i < labels_.size(); ++i) label_id[labels_[i]] = int64_t(i);
  for (const Row& r : rows) {
    const std::string_view label = trim(r.fields[label_col]);
    auto it = label_id.find(label);
    if (it == label_id.end()) {
      std::string known;
      for (size_t i = 0; i < labels_.size() && i < 10; ++i) known += (i ? ", " : "") + labels_[i];
      KILN_FAIL(path, ":", r.line, ": the label ", shown(label), " is not one of the ", labels_.size(),
                " training labels (", known, labels_.size() > 10 ? ", ..." : "", ")");
    }
    // [CLS] a [SEP], or a pair [CLS] a [SEP] b [SEP] (token type 1 from b on), cut to seq_len.
    // Only the tokens that can be kept are read (a 30 MB line took seconds and a gigabyte to tokenize
    // whole), and the cut is the one the whole texts' tokens would get.
    std::vector<int64_t> a, b;
    if (pair_col == kNone) {
      a = tok_->encode(text_of(r, text_col), size_t(seq_len_ - 2));
    } else {
      // longest_first's cut depends on a length only up to room + 1, but for one token: when both
      // texts are longer than an odd room, the longer one (a when a > b) keeps room / 2 + 1. That is
      // settled by counting both, in step, until one ends.
      const size_t room = size_t(seq_len_ - 3);
      const std::string_view ta = text_of(r, text_col), tb = text_of(r, pair_col);
      a = tok_->encode(ta, room + 1);
      b = tok_->encode(tb, room + 1);
      size_t la = a.size(), lb = b.size();
      if (la > room && lb > room && room % 2 == 1) {
        size_t ca = 0, cb = 0;
        for (size_t upto = 2 * (room + 1);; upto *= 4) {
          ca = tok_->count(ta, upto);
          cb = tok_->count(tb, upto);
          if (ca < upto || cb < upto) break;
        }
        la = ca > cb ? room + 2 : room + 1;  // the same comparison as the whole lengths'
      }
      const auto [na, nb] = longest_first(la, lb, room);
      a.resize(na);
      b.resize(nb);
    }
    std::vector<int32_t> s = {int32_t(tok_->cls_id)};
    for (int64_t id : a) s.push_back(int32_t(id));
    s.push_back(int32_t(tok_->sep_id));
    firsts_.push_back(int32_t(s.size()));
    if (pair_col != kNone) {
      for (int64_t id : b) s.push_back(int32_t(id));
      s.push_back(int32_t(tok_->sep_id));
    }
    seqs_.push_back(std::move(s));
    targets_.push_back(it->second);
  }
}

Batch TsvClassificationDataset::get_batch(const std::vector<int64_t>& indices, uint64_t) const {
  const int64_t b = int64_t(indices.size());
  Batch out = text_batch(b, seq_len_, tok_->pad_id);
  Tensor target = make_tensor({b}, DType::i64, kCPU);
  int64_t* ids = out["input_ids"].data<int64_t>();
  int64_t* mask = out["attention_mask"].data<int64_t>();
  int64_t* types = out["token_type_ids"].data<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = indices[size_t(i)];
    KILN_CHECK(n >= 0 && n < size(), "classification: sample ", n, " out of range [0, ", size(), ")");
    const auto& s = seqs_[size_t(n)];
    for (size_t j = 0; j < s.size(); ++j) {
      ids[i * seq_len_ + int64_t(j)] = s[j];
      mask[i * seq_len_ + int64_t(j)] = 1;
      types[i * seq_len_ + int64_t(j)] = int64_t(j) < firsts_[size_t(n)] ? 0 : 1;
    }
    target.data<int64_t>()[i] = targets_[size_t(n)];
  }
  out["target"] = target;
  return out;
}

}  // namespace kiln::io
