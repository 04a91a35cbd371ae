// Text for BERT: UTF-8, the basic tokenizer (cleaning, lower-casing, accent stripping, punctuation
// and CJK splitting, as BERT's for all of Unicode), a WordPiece vocabulary and tokenizer, a vocabulary
// builder, and the two text data sets: a corpus packed into masked-LM sequences, and
// `label<TAB>text` classification files.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/data.h"

namespace kiln::io {

// Code points of `s`; a malformed byte becomes U+FFFD.
std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(std::u32string_view s);

// The lines of `text` without their ends: split at "\n" (a "\r\n" pair is one end, a lone "\r" is
// content), or at "\r" when the text holds no "\n" at all (old Mac files).
std::vector<std::string_view> split_lines(std::string_view text);
// Binary data, not text: the offset of a NUL byte in the first kBinaryHead bytes of `text`, or npos.
// The one test for read_text_file and the --text directory walk, so the two cannot disagree.
inline constexpr size_t kBinaryHead = 4096;
size_t binary_offset(std::string_view text);
// binary_offset of the first kBinaryHead bytes of `path`, gunzipped when it is gzip (only that head is
// decompressed): a .gz is judged by what it holds. A file that cannot be opened or decompressed is
// judged on its raw bytes (reading it says what is wrong).
size_t file_binary_offset(const std::string& path);
// A text file (gzip-compressed or not) without its UTF-8 byte order mark; binary data (binary_offset)
// is an error naming the file, bytes that are not UTF-8 a warning.
std::string read_text_file(const std::string& path);

// What lower-casing and accent stripping do (the help of --lower-case says it).
inline constexpr const char* kLowerCaseScope =
    "lower-cases as Python's str.lower() and strips accents by NFD, dropping the nonspacing marks (category "
    "Mn), as BERT's uncased tokenizer does, for every code point of Unicode 14.0.0 (io/unicode.h)";

struct BasicTokenizerOptions {
  bool lower_case = true;     // kLowerCaseScope
  bool strip_accents = true;  // NFD, then the nonspacing marks dropped
};
// BERT's basic tokenizer, step for step (Hugging Face's Python BasicTokenizer, tokenization_bert's
// BertTokenizerLegacy; checked on every code point of the tables' Unicode version): keeps the
// special tokens of kBertSpecialTokens whole where the text holds them as written; drops NUL, U+FFFD
// and the control, format, private-use and unassigned characters (category C*); makes every CJK
// ideograph a word; splits at whitespace; lower-cases and strips accents each word; splits every
// punctuation mark (ASCII symbols and category P*) off as a token of its own. Without lower-casing
// and accent stripping (cased models) the text is not normalized at all, as in BERT and Hugging
// Face's fast tokenizer (its slow BertTokenizer composes it to NFC first).
std::vector<std::string> basic_tokenize(std::string_view text, const BasicTokenizerOptions& o = {});

// A vocabulary: token i is line i of a vocab.txt (blank lines at its end are ignored).
class Vocab {
 public:
  static Vocab load(const std::string& path);
  static Vocab from_tokens(std::vector<std::string> tokens, std::string source);
  void save(const std::string& path) const;  // atomically
  int64_t size() const { return int64_t(tokens_.size()); }
  int64_t id(const std::string& token) const;  // -1 when absent
  const std::string& token(int64_t id) const;
  // The id of `token`, or an error naming the vocabulary and why it is needed.
  int64_t require(const std::string& token, const std::string& why) const;
  const std::string& source() const { return source_; }

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> ids_;
  std::string source_;
};

// Greedy longest-match-first WordPiece over the basic tokenizer's words; continuation pieces carry
// "##"; a word with no segmentation, or longer than max_chars_per_word, becomes [UNK].
class WordPieceTokenizer {
 public:
  explicit WordPieceTokenizer(Vocab vocab, BasicTokenizerOptions o = {}, int64_t max_chars_per_word = 100);
  // The first max_tokens tokens (all by default): the text after them is not read, and they are the
  // whole text's tokens' first max_tokens.
  std::vector<std::string> tokenize(std::string_view text, size_t max_tokens = SIZE_MAX) const;
  std::vector<int64_t> encode(std::string_view text, size_t max_tokens = SIZE_MAX) const;  // no special tokens added
  // How many tokens the text has, up to max_tokens (then max_tokens), without keeping them.
  size_t count(std::string_view text, size_t max_tokens = SIZE_MAX) const;
  // Tokens joined with spaces, continuation pieces glued to the piece before.
  std::string decode(const std::vector<int64_t>& ids) const;
  const Vocab& vocab() const { return vocab_; }
  int64_t unk_id = -1, pad_id = -1, cls_id = -1, sep_id = -1, mask_id = -1;  // -1 when the vocab lacks them

 private:
  Vocab vocab_;
  BasicTokenizerOptions o_;
  int64_t max_chars_;
};

inline const std::vector<std::string> kBertSpecialTokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};

// A WordPiece vocabulary of at most `size` tokens learned from text files: the special tokens, every
// character seen (as a word start and as a "##" continuation), then the most frequent merges of
// adjacent pieces (ties broken by the merged string, so the result is deterministic) while a pair
// occurs at least `min_frequency` times.
Vocab build_wordpiece_vocab(const std::vector<std::string>& files, int64_t size, const BasicTokenizerOptions& o = {},
                            int64_t min_frequency = 2);

// ---- data sets ---------------------------------------------------------------------------------

struct MlmOptions {
  int64_t seq_len = 128;
  // of the tokens other than [CLS], [SEP] and [UNK]; of those 80% [MASK], 10% random, 10% kept. A
  // sequence that drew none gets one, so the real share is higher on short sequences.
  double mask_prob = 0.15;
};

// Text files packed into sequences [CLS] tokens [SEP] [PAD]...: lines are appended to a sequence
// while they fit; a blank line or a line holding only "%" (the fortune format) ends a document and
// its sequence. Batches: input_ids, attention_mask, token_type_ids (i64 [B, L]) and labels (the
// original id where a token was masked, -100 elsewhere). Masking is a function of (seed, sample);
// [UNK] is never masked (as Hugging Face's collator); a sequence that drew no mask gets one masked
// token (an [UNK] only when it holds nothing else), so every sequence has a target.
class MlmDataset final : public Dataset {
 public:
  MlmDataset(std::shared_ptr<const WordPieceTokenizer> tok, const std::vector<std::string>& files, MlmOptions o);
  int64_t size() const override { return int64_t(seqs_.size()); }
  Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override;
  int64_t tokens() const { return tokens_; }
  // Sequences [from, to) as a data set of its own (a held-out split).
  std::shared_ptr<MlmDataset> subset(int64_t from, int64_t to) const;

 private:
  MlmDataset() = default;
  std::shared_ptr<const WordPieceTokenizer> tok_;
  MlmOptions o_;
  std::vector<std::vector<int32_t>> seqs_;  // with [CLS]/[SEP], without padding
  int64_t tokens_ = 0;
};

// `label<TAB>text` lines (the text is the rest of the line, tabs kept; the same 3+ columns on every
// line without a header is refused as a layout, GLUE's CoLA); or, when the first
// non-blank line is a header with a column named "label" (else "Quality", "gold_label" or
// "is_duplicate", GLUE's names), any number of columns: the label is that column, the text a
// sentence pair when the header names one of GLUE's (sentence1/sentence2, question/sentence,
// question1/question2, premise/hypothesis, #1 String/#2 String), else the column named "sentence" or
// "text", else the only other column, or the two other ones (a pair, in file order; columns named id,
// idx or index are not text), so GLUE's files
// load as they are; when the (last) text column is the last, a row with more fields than the header
// keeps its tabs in the text. Lines end as split_lines says; blank lines are
// skipped; labels lose surrounding spaces (spaces inside are kept). Labels are names; `label_names`
// fixes their ids (empty: this file's distinct labels, in numeric order when all are integers, else
// sorted as text; more distinct labels than half of 20 or more rows is a warning naming the file and
// the column taken as the label). Errors name the file and line.
// Batches: input_ids, attention_mask, token_type_ids (i64 [B, L]: [CLS] text [SEP], or as Hugging
// Face's tokenizer(a, b) [CLS] a [SEP] b [SEP] with type 1 from b on; cut to seq_len, a pair by
// 'longest_first') and target (i64 [B]).
// The lengths a pair of `a` and `b` tokens keeps in `room` tokens, cut as Hugging Face's tokenizers
// cut one by default ('longest_first'): the longer text alone while that is enough, else both, the
// shorter (the first on a tie) to half the room and the other to the rest.
std::pair<size_t, size_t> longest_first(size_t a, size_t b, size_t room);

class TsvClassificationDataset final : public Dataset {
 public:
  TsvClassificationDataset(std::shared_ptr<const WordPieceTokenizer> tok, const std::string& path, int64_t seq_len,
                           std::vector<std::string> label_names = {});
  int64_t size() const override { return int64_t(seqs_.size()); }
  Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override;
  bool random() const override { return false; }  // a sequence is the same at every read
  const std::vector<std::string>& label_names() const { return labels_; }
  // The header's names of the text column, or of a pair's two; empty without a header.
  const std::vector<std::string>& text_columns() const { return text_columns_; }

 private:
  std::shared_ptr<const WordPieceTokenizer> tok_;
  int64_t seq_len_;
  std::vector<std::string> labels_, text_columns_;
  std::vector<std::vector<int32_t>> seqs_;
  std::vector<int32_t> firsts_;  // tokens of type 0: [CLS] a [SEP]
  std::vector<int64_t> targets_;
};

}  // namespace kiln::io
