// Text for BERT: the basic tokenizer (punctuation, accents, CJK, controls, bad UTF-8), WordPiece,
// vocabularies (files, errors, the builder), masked-LM masking statistics and TSV classification.
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "io/safetensors.h"
#include "io/text.h"
#include "io/unicode.h"
#include "kiln.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;
using kiln::testing::TempDir;
using Words = std::vector<std::string>;

namespace {
std::shared_ptr<io::WordPieceTokenizer> toy_tokenizer() {
  Words t = io::kBertSpecialTokens;
  for (const char* w : {"un", "##aff", "##able", "aff", "able", "runs", "run", "##s", "the", "a", "b", "c", ",", "!", "hello", "world"})
    t.push_back(w);
  return std::make_shared<io::WordPieceTokenizer>(io::Vocab::from_tokens(t, "toy vocab"));
}
}  // namespace

TEST_CASE("basic tokenizer: whitespace, punctuation, case, accents, CJK, controls, malformed UTF-8") {
  CHECK(io::basic_tokenize("Hello, World!") == Words{"hello", ",", "world", "!"});
  CHECK(io::basic_tokenize("  tabs\tand\nnewlines\r\n ") == Words{"tabs", "and", "newlines"});
  CHECK(io::basic_tokenize("H\xc3\xa9llo \xc3\x91" "and\xc3\xba Stra\xc3\x9f" "e") == Words{"hello", "nandu", "straße"});
  CHECK(io::basic_tokenize("e\xcc\x81t\xc3\xa9") == Words{"ete"});  // a combining acute accent, and a precomposed one
  CHECK(io::basic_tokenize("\xc5\x81\xc3\xb3" "d\xc5\xba") == Words{"łodz"});  // Ł has no decomposition; ź does
  CHECK(io::basic_tokenize("ab\xe4\xb8\xad\xe6\x96\x87" "cd") == Words{"ab", "中", "文", "cd"});
  CHECK(io::basic_tokenize("a\x01" "b\x7f" "c") == Words{"abc"});
  CHECK(io::basic_tokenize("a\xff" "b") == Words{"ab"});  // U+FFFD is dropped like a control
  CHECK(io::basic_tokenize("no\xc2\xa0" "break\xe3\x80\x80" "space") == Words{"no", "break", "space"});
  CHECK(io::basic_tokenize("\xc2\xabquoted\xc2\xbb\xe2\x80\x94" "dash") == Words{"«", "quoted", "»", "—", "dash"});
  CHECK(io::basic_tokenize("don't e-mail $5") == Words{"don", "'", "t", "e", "-", "mail", "$", "5"});
  CHECK(io::basic_tokenize("\xce\x91\xce\x92\xce\x93 \xd0\x94\xd0\x96") == Words{"αβγ", "дж"});
  CHECK(io::basic_tokenize("Caf\xc3\xa9", {false, false}) == Words{"Café"});
  CHECK(io::basic_tokenize("").empty());
  CHECK(io::decode_utf8("\xe2\x82") == std::u32string{0xFFFD, 0xFFFD});  // truncated sequence
  CHECK(io::decode_utf8("\xc0\xaf") == std::u32string{0xFFFD, 0xFFFD});  // overlong '/'
  CHECK(io::encode_utf8(io::decode_utf8("x\xf0\x9f\x98\x80y")) == "x\xf0\x9f\x98\x80y");
}

TEST_CASE("wordpiece: greedy longest match, [UNK] for what cannot be split, decode glues pieces") {
  auto tok = toy_tokenizer();
  CHECK(tok->tokenize("unaffable") == Words{"un", "##aff", "##able"});
  CHECK(tok->tokenize("Runs, hello!") == Words{"runs", ",", "hello", "!"});
  CHECK(tok->tokenize("unxyz the") == Words{"[UNK]", "the"});
  CHECK(tok->tokenize(std::string(101, 'a')) == Words{"[UNK]"});  // longer than 100 characters
  const auto ids = tok->encode("the unaffable world");
  CHECK(ids.size() == 5);
  CHECK(tok->decode(ids) == "the unaffable world");
  CHECK(tok->cls_id == 2);
  CHECK(tok->mask_id == 4);
}

TEST_CASE("vocab: file round trip, duplicates, missing special tokens") {
  TempDir d("kiln_vocab");
  const auto tok = toy_tokenizer();
  tok->vocab().save(d / "vocab.txt");
  const io::Vocab back = io::Vocab::load(d / "vocab.txt");
  REQUIRE(back.size() == tok->vocab().size());
  for (int64_t i = 0; i < back.size(); ++i) CHECK(back.token(i) == tok->vocab().token(i));
  std::ofstream(d / "crlf.txt") << "[UNK]\r\nhello\r\n";
  CHECK(io::Vocab::load(d / "crlf.txt").id("hello") == 1);
  std::ofstream(d / "dup.txt") << "[UNK]\na\nb\na\n";
  CHECK(contains(error_of([&] { io::Vocab::load(d / "dup.txt"); }), "'a' appears twice (lines 2 and 4)"));
  std::ofstream(d / "nounk.txt") << "a\nb\n";
  CHECK(contains(error_of([&] { io::WordPieceTokenizer(io::Vocab::load(d / "nounk.txt")); }), "no [UNK] token"));
  CHECK(contains(error_of([&] { io::Vocab::load(d / "absent.txt"); }), "absent.txt: cannot open"));
  // Blank lines at the end are ignored (Hugging Face reads the same tokens); one inside is an error.
  std::ofstream(d / "blank_end.txt") << "[UNK]\na\nb\n\n\n";
  CHECK(io::Vocab::load(d / "blank_end.txt").size() == 3);
  std::ofstream(d / "blank_mid.txt") << "[UNK]\na\n\nb\n";
  CHECK(contains(error_of([&] { io::Vocab::load(d / "blank_mid.txt"); }), "token 2 (line 3) is empty"));
  std::ofstream(d / "corpus.txt") << "some words here\n";
  std::ofstream(d / "nomask.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nsome\nwords\n";
  auto nomask = std::make_shared<io::WordPieceTokenizer>(io::Vocab::load(d / "nomask.txt"));
  CHECK(contains(error_of([&] { io::MlmDataset(nomask, {d / "corpus.txt"}, {}); }), "nomask.txt: the vocabulary has no [MASK]"));
}

TEST_CASE("vocab builder: specials first, every character, frequent words whole, deterministic") {
  TempDir d("kiln_vocab");
  {
    std::ofstream f(d / "corpus.txt");
    for (int i = 0; i < 200; ++i) f << "the quick brown fox jumps over the lazy dog. The dog sleeps!\n";
    f << "zebra x\n";
  }
  const io::Vocab v = io::build_wordpiece_vocab({d / "corpus.txt"}, 60);
  const io::Vocab w = io::build_wordpiece_vocab({d / "corpus.txt"}, 60);
  CHECK(v.size() == 60);
  for (int64_t i = 0; i < v.size(); ++i) CHECK(v.token(i) == w.token(i));
  for (size_t i = 0; i < io::kBertSpecialTokens.size(); ++i) CHECK(v.token(int64_t(i)) == io::kBertSpecialTokens[i]);
  for (const char* s : {"the", "dog", "z", "##e", "!", "."}) CHECK_MESSAGE(v.id(s) >= 0, s);
  io::WordPieceTokenizer tok(v);
  CHECK(tok.tokenize("The dog") == Words{"the", "dog"});
  for (const auto& t : tok.tokenize("the quick brown fox jumps over the lazy dog zebra x")) CHECK(t != "[UNK]");
  // A size the corpus cannot fill stops at the last pair that occurs twice.
  CHECK(io::build_wordpiece_vocab({d / "corpus.txt"}, 100000).size() < 200);
  CHECK(contains(error_of([&] { io::build_wordpiece_vocab({d / "corpus.txt"}, 3); }), "no room"));
}

TEST_CASE("basic tokenizer: --lower-case is str.lower(); Turkish I with dot to i; final sigma") {
  CHECK(io::basic_tokenize("\xc4\xb0stanbul") == Words{"istanbul"});  // not dotless "ıstanbul"
  CHECK(io::basic_tokenize("\xc4\xb0") != io::basic_tokenize("\xc4\xb1"));
  CHECK(contains(io::kLowerCaseScope, std::string("Unicode ") + io::unicode::kUnicodeVersion));
  // The expectations below are Hugging Face's BertTokenizer (transformers 5.25, BasicTokenizer) on the
  // same text. An accented Greek capital and a fullwidth capital; cased: kept.
  CHECK(io::basic_tokenize("\xce\x86 \xef\xbc\xa1") == Words{"\xce\xb1", "\xef\xbd\x81"});
  CHECK(io::basic_tokenize("\xce\x86 \xef\xbc\xa1", {false, false}) == Words{"\xce\x86", "\xef\xbc\xa1"});
  // ΟΔΟΣ ΟΔΟΣ. ΣΑ: a capital sigma ending a word is ς, also before punctuation; σ elsewhere.
  CHECK(io::basic_tokenize("\xce\x9f\xce\x94\xce\x9f\xce\xa3 \xce\x9f\xce\x94\xce\x9f\xce\xa3. \xce\xa3\xce\x91") ==
        Words{"\xce\xbf\xce\xb4\xce\xbf\xcf\x82", "\xce\xbf\xce\xb4\xce\xbf\xcf\x82", ".", "\xcf\x83\xce\xb1"});
}

TEST_CASE("basic tokenizer: control, format and private-use characters are dropped (category C*)") {
  // Soft hyphen, word joiner, private use, bidi embedding and isolate, Mongolian vowel separator, a tag
  // character, U+FFFD and NUL: Hugging Face gives "abcdefghij" for both cases.
  const std::string text =
      "a\xc2\xad"
      "b\xe2\x81\xa0"
      "c\xee\x80\x80"
      "d\xe2\x80\xaa"
      "e\xe2\x81\xa6"
      "f\xe1\xa0\x8e"
      "g\xf3\xa0\x80\xa0"
      "h\xef\xbf\xbd"
      "i" +
      std::string(1, '\0') + "j";
  CHECK(io::basic_tokenize(text) == Words{"abcdefghij"});
  CHECK(io::basic_tokenize(text, {false, false}) == Words{"abcdefghij"});
  // Line and paragraph separators split words (str.split does), unassigned code points are dropped.
  CHECK(io::basic_tokenize("a\xe2\x80\xa8"
                           "b\xe2\x80\xa9"
                           "c\xcd\xb8"
                           "d") == Words{"a", "b", "cd"});
  auto tok = toy_tokenizer();
  CHECK(tok->tokenize("hel\xc2\xadlo") == Words{"hello"});
}

TEST_CASE("basic tokenizer: punctuation is category P* and the ASCII symbols, not other symbols") {
  // يا، لا؟ (Arabic comma and question mark)
  CHECK(io::basic_tokenize("\xd9\x8a\xd8\xa7\xd8\x8c \xd9\x84\xd8\xa7\xd8\x9f") ==
        Words{"\xd9\x8a\xd8\xa7", "\xd8\x8c", "\xd9\x84\xd8\xa7", "\xd8\x9f"});
  // a・b⸀c (katakana middle dot, a supplemental punctuation mark)
  CHECK(io::basic_tokenize("a\xe3\x83\xbb"
                           "b\xe2\xb8\x80"
                           "c") == Words{"a", "\xe3\x83\xbb", "b", "\xe2\xb8\x80", "c"});
  // 1⁄2 ＄5＋＜x⁒: the fraction slash, fullwidth $ + < and the commercial minus are symbols (S*), not split.
  CHECK(io::basic_tokenize("1\xe2\x81\x84"
                           "2 \xef\xbc\x84"
                           "5\xef\xbc\x8b\xef\xbc\x9cx\xe2\x81\x92",
                           {false, false}) == Words{"1\xe2\x81\x84"
                                                    "2",
                                                    "\xef\xbc\x84"
                                                    "5\xef\xbc\x8b\xef\xbc\x9cx\xe2\x81\x92"});
}

TEST_CASE("basic tokenizer: uncased is lower-case, NFD, nonspacing marks (Mn) dropped, for all scripts") {
  // यह है। (Devanagari): the vowel sign of है is Mn, dropped uncased, kept cased; the danda is punctuation.
  const std::string hindi = "\xe0\xa4\xaf\xe0\xa4\xb9 \xe0\xa4\xb9\xe0\xa5\x88\xe0\xa5\xa4";
  CHECK(io::basic_tokenize(hindi) == Words{"\xe0\xa4\xaf\xe0\xa4\xb9", "\xe0\xa4\xb9", "\xe0\xa5\xa4"});
  CHECK(io::basic_tokenize(hindi, {false, false}) ==
        Words{"\xe0\xa4\xaf\xe0\xa4\xb9", "\xe0\xa4\xb9\xe0\xa5\x88", "\xe0\xa5\xa4"});
  // 한국어: Hangul syllables decompose into their jamo (U+1112 1161 11AB 1100 116E 11A8 110B 1165).
  const std::string korean = "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4";
  CHECK(io::basic_tokenize(korean) == Words{"\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab\xe1\x84\x80\xe1\x85\xae\xe1\x86\xa8"
                                            "\xe1\x84\x8b\xe1\x85\xa5"});
  CHECK(io::basic_tokenize(korean, {false, false}) == Words{korean});
  // がぎ: the voicing mark goes (かき).
  CHECK(io::basic_tokenize("\xe3\x81\x8c\xe3\x81\x8e") == Words{"\xe3\x81\x8b\xe3\x81\x8d"});
  // ❤️: the variation selector U+FE0F is Mn.
  CHECK(io::basic_tokenize("\xe2\x9d\xa4\xef\xb8\x8f") == Words{"\xe2\x9d\xa4"});
  // A CJK compatibility ideograph (U+F900) decomposes to U+8C48.
  CHECK(io::basic_tokenize("\xef\xa4\x80") == Words{"\xe8\xb1\x88"});
  // Canonical ordering: two combining musical symbols (Mc, classes 226 then 216) are swapped.
  CHECK(io::basic_tokenize("x\xf0\x9d\x85\xad\xf0\x9d\x85\xa5") == Words{"x\xf0\x9d\x85\xa5\xf0\x9d\x85\xad"});
  CHECK(io::unicode::nfd(U"\u00c5\u0316") == std::u32string(U"A\u0316\u030a"));  // below (220) before above (230)
}

TEST_CASE("wordpiece: [CLS] [SEP] [MASK] [PAD] [UNK] written in the text stay whole, as written") {
  auto tok = toy_tokenizer();
  CHECK(io::basic_tokenize("hello [MASK].") == Words{"hello", "[MASK]", "."});
  CHECK(io::basic_tokenize("hello[MASK].", {false, false}) == Words{"hello", "[MASK]", "."});
  CHECK(tok->tokenize("a[CLS]b [SEP][PAD][UNK]") == Words{"a", "[CLS]", "b", "[SEP]", "[PAD]", "[UNK]"});
  CHECK(tok->encode("hello [MASK] world") ==
        std::vector<int64_t>{tok->vocab().id("hello"), tok->mask_id, tok->vocab().id("world")});
  // Case-sensitive: "[mask]" is three tokens.
  CHECK(io::basic_tokenize("[mask] [Mask]") == Words{"[", "mask", "]", "[", "mask", "]"});
  // The vocabulary builder counts no characters of a special token in its corpus.
  TempDir d("kiln_vocab");
  std::ofstream(d / "corpus.txt") << "the [MASK] dog\nthe [MASK] cat\n";
  const io::Vocab v = io::build_wordpiece_vocab({d / "corpus.txt"}, 100);
  CHECK(v.id("[MASK]") == 4);
  CHECK(v.id("##M") == -1);
  CHECK(v.id("[") == -1);
}

TEST_CASE("masked LM: packing, 15% masked as 80/10/10, reproducible per (seed, sample)") {
  TempDir d("kiln_mlm");
  auto tok = toy_tokenizer();
  {
    std::ofstream f(d / "corpus.txt");
    for (int i = 0; i < 3000; ++i) f << "the a b c runs hello world , the a b c !\n" << (i % 7 == 6 ? "%\n" : "");
  }
  io::MlmDataset ds(tok, {d / "corpus.txt"}, {32, 0.15});
  REQUIRE(ds.size() > 100);
  std::vector<int64_t> all(size_t(ds.size()));
  for (int64_t i = 0; i < ds.size(); ++i) all[size_t(i)] = i;
  const io::Batch b = ds.get_batch(all, 42);
  const Tensor& ids = b.at("input_ids");
  CHECK(ids.shape() == Shape{ds.size(), 32});
  int64_t real = 0, masked = 0, as_mask = 0, kept = 0;
  const int64_t* x = ids.data<int64_t>();
  const int64_t* l = b.at("labels").data<int64_t>();
  const int64_t* m = b.at("attention_mask").data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (!m[i]) {
      CHECK(x[i] == tok->pad_id);
      CHECK(l[i] == -100);
      continue;
    }
    if (i % 32 == 0) CHECK(x[i] == tok->cls_id);
    if (x[i] == tok->cls_id || x[i] == tok->sep_id) continue;
    ++real;
    if (l[i] == -100) continue;
    ++masked;
    as_mask += x[i] == tok->mask_id;
    kept += x[i] == l[i];
  }
  const double rate = double(masked) / double(real);
  CHECK(rate == doctest::Approx(0.15).epsilon(0.1));  // within 10% of 15%
  CHECK(double(as_mask) / double(masked) == doctest::Approx(0.8).epsilon(0.05));
  // Kept: the 10% left alone plus random draws that hit the original token (1 in 21 here).
  CHECK(double(kept) / double(masked) == doctest::Approx(0.1 + 0.1 / 21).epsilon(0.2));
  // Every sequence has a target; the same (seed, sample) masks the same way in any batch.
  for (int64_t i = 0; i < ds.size(); ++i) {
    bool any = false;
    for (int64_t j = 0; j < 32; ++j) any = any || l[i * 32 + j] != -100;
    CHECK(any);
  }
  const io::Batch one = ds.get_batch({7}, 42);
  CHECK(std::equal(x + 7 * 32, x + 8 * 32, one.at("input_ids").data<int64_t>()));
  CHECK(ds.get_batch({7}, 43).at("labels").to_vector() != one.at("labels").to_vector());
  CHECK(contains(error_of([&] { io::MlmDataset(tok, {d / "corpus.txt"}, {4, 0.15}); }), "at least 8"));
}

TEST_CASE("tsv classification: header, label ids, cut to length, errors name file and line") {
  TempDir d("kiln_tsv");
  auto tok = toy_tokenizer();
  std::ofstream(d / "train.tsv") << "label\ttext\npos\thello world\nneg\tthe a b c runs the a b c runs\npos\trun\n";
  io::TsvClassificationDataset train(tok, d / "train.tsv", 8);
  CHECK(train.size() == 3);
  CHECK(train.label_names() == Words{"neg", "pos"});
  const io::Batch b = train.get_batch({0, 1}, 0);
  CHECK(b.at("target").to_vector() == std::vector<double>{1, 0});
  const auto row = b.at("input_ids").to_vector();
  CHECK(row[0] == tok->cls_id);
  CHECK(row[3] == tok->sep_id);
  CHECK(row[8 + 7] == tok->sep_id);  // cut to 8 with [SEP] kept
  CHECK(b.at("attention_mask").to_vector()[4] == 0);
  std::ofstream(d / "eval.tsv") << "pos\thello\nmaybe\tworld\n";
  CHECK(contains(error_of([&] { io::TsvClassificationDataset(tok, d / "eval.tsv", 8, train.label_names()); }),
                 "eval.tsv:2: the label 'maybe' is not one of the 2 training labels (neg, pos)"));
  std::ofstream(d / "bad.tsv") << "pos\thello\nno tab here\n";
  CHECK(contains(error_of([&] { io::TsvClassificationDataset(tok, d / "bad.tsv", 8); }), "bad.tsv:2: expected label<TAB>text"));
}

namespace {
// The (label name, first token of the text) of every sample, in file order.
std::vector<std::pair<std::string, std::string>> tsv_samples(const io::TsvClassificationDataset& ds,
                                                             const io::WordPieceTokenizer& tok) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const io::Batch b = ds.get_batch({i}, 0);
    out.emplace_back(ds.label_names().at(size_t(b.at("target").data<int64_t>()[0])),
                     tok.vocab().token(b.at("input_ids").data<int64_t>()[1]));
  }
  return out;
}
using Samples = std::vector<std::pair<std::string, std::string>>;

// The tokens of sample i's text (between [CLS] and [SEP]).
Words tsv_text(const io::TsvClassificationDataset& ds, const io::WordPieceTokenizer& tok, int64_t i) {
  const io::Batch b = ds.get_batch({i}, 0);
  const auto ids = b.at("input_ids").to_vector();
  Words out;
  for (size_t j = 1; j < ids.size() && int64_t(ids[j]) != tok.sep_id; ++j)
    out.push_back(tok.vocab().token(int64_t(ids[j])));
  return out;
}

// What `f` writes to stderr (fd 2, where kiln's warnings go).
template <typename F> std::string stderr_of(F&& f, const std::string& scratch) {
  std::fflush(stderr);
  const int saved = ::dup(2);
  std::FILE* tmp = std::fopen(scratch.c_str(), "w");
  ::dup2(::fileno(tmp), 2);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(tmp);
  return kiln::testing::read_text(scratch);
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
}
}  // namespace

TEST_CASE("tsv classification: headers name the label and text columns (GLUE's sentence<TAB>label)") {
  TempDir d("kiln_tsv");
  auto tok = toy_tokenizer();
  // SST-2's layout; a header after blank lines; a header with a third column; a header in any case.
  std::ofstream(d / "sst2.tsv") << "sentence\tlabel\nhello world\t1\nthe runs\t0\na b\t1\nc\t0\n";
  io::TsvClassificationDataset sst2(tok, d / "sst2.tsv", 8);
  CHECK(sst2.size() == 4);
  CHECK(sst2.label_names() == Words{"0", "1"});
  CHECK(tsv_samples(sst2, *tok) == Samples{{"1", "hello"}, {"0", "the"}, {"1", "a"}, {"0", "c"}});
  std::ofstream(d / "three.tsv") << "\n  \nLabel\tSentence\tid\npos\thello\t7\nneg\tworld\t8\n";
  io::TsvClassificationDataset three(tok, d / "three.tsv", 8);
  CHECK(tsv_samples(three, *tok) == Samples{{"pos", "hello"}, {"neg", "world"}});
  std::ofstream(d / "text.tsv") << "id\ttext\tlabel\n7\tworld\tneg\n";
  CHECK(tsv_samples(io::TsvClassificationDataset(tok, d / "text.tsv", 8), *tok) == Samples{{"neg", "world"}});
  // Errors: a header without a text column, a short row.
  std::ofstream(d / "notext.tsv") << "id\tlabel\ta\tb\tc\n1\tpos\thello\tx\ty\n";
  CHECK(contains(error_of([&] { io::TsvClassificationDataset(tok, d / "notext.tsv", 8); }),
                 "notext.tsv:1: the header ('id', 'label', 'a', 'b', 'c') names a label column but no text column"));
  std::ofstream(d / "short.tsv") << "label\tsentence\tid\npos\thello\t1\nneg\tworld\n";
  CHECK(contains(error_of([&] { io::TsvClassificationDataset(tok, d / "short.tsv", 8); }),
                 "short.tsv:3: expected 3 columns as the header, got 2 columns"));
}

TEST_CASE("tsv classification: labels with spaces load; many distinct labels are a warning, not an error") {
  TempDir d("kiln_tsv");
  auto tok = toy_tokenizer();
  // Class names with a space (AG News' "World News", a "very positive" rating) are labels.
  std::ofstream(d / "spaced.tsv") << "very positive\thello\nWorld News\tworld\nvery positive\trun\n";
  io::TsvClassificationDataset spaced(tok, d / "spaced.tsv", 8);
  CHECK(tsv_samples(spaced, *tok) ==
        Samples{{"very positive", "hello"}, {"World News", "world"}, {"very positive", "run"}});
  // Many classes over many rows (an intent data set, or text in the label column): loads, and says so
  // naming the file and the column taken as the label.
  {
    std::ofstream f(d / "words.tsv");
    for (int i = 0; i < 30; ++i) f << "word" << i << "\thello\n";
  }
  std::optional<io::TsvClassificationDataset> words;
  const std::string said = stderr_of([&] { words.emplace(tok, d / "words.tsv", 8); }, d / "stderr.txt");
  CHECK(words->label_names().size() == 30);
  CHECK_MESSAGE(
      contains(said, "warning: " + d / "words.tsv" + ": 30 distinct labels in 30 rows, taking column 1 as the label"),
      said);
  {
    std::ofstream f(d / "ten.tsv");  // few classes over many rows: nothing said
    for (int i = 0; i < 30; ++i) f << "c" << i % 10 << "\thello\n";
  }
  const std::string quiet =
      stderr_of([&] { CHECK(io::TsvClassificationDataset(tok, d / "ten.tsv", 8).label_names().size() == 10); },
                d / "stderr2.txt");
  CHECK_MESSAGE(!contains(quiet, "distinct labels"), quiet);
}

TEST_CASE("tsv classification: a TAB in the text is kept (split at the first TAB, or at the header's columns)") {
  TempDir d("kiln_tsv");
  auto tok = toy_tokenizer();
  // No header: the label, then the rest of the line as the text.
  std::ofstream(d / "tabs.tsv") << "pos\thello\tworld\nneg\tthe\t\trun\nsrc\t1\t\thello world\n";
  io::TsvClassificationDataset tabs(tok, d / "tabs.tsv", 8);
  CHECK(tabs.label_names() == Words{"neg", "pos", "src"});
  CHECK(tsv_text(tabs, *tok, 0) == Words{"hello", "world"});
  CHECK(tsv_text(tabs, *tok, 1) == Words{"the", "run"});
  // A header with the text column last: extra fields are more of the text.
  std::ofstream(d / "last.tsv") << "label\ttext\npos\thello\tworld\nneg\trun\n";
  io::TsvClassificationDataset last(tok, d / "last.tsv", 8);
  CHECK(tsv_text(last, *tok, 0) == Words{"hello", "world"});
  CHECK(tsv_text(last, *tok, 1) == Words{"run"});
  // The text column not last: a row with more fields than the header is an error.
  std::ofstream(d / "first.tsv") << "sentence\tlabel\nhello\tworld\t1\n";
  CHECK(contains(error_of([&] { io::TsvClassificationDataset(tok, d / "first.tsv", 8); }),
                 "first.tsv:2: expected 2 columns as the header, got 3 columns"));
  // The same columns on every line without a header is a layout (GLUE's CoLA), not tabs in the text:
  // refused, not trained with the source codes as labels.
  std::ofstream(d / "cola.tsv") << "gj04\t1\t\tthe run\ngj04\t0\t*\thello world\nbc01\t1\t\trun\n";
  CHECK(contains(error_of([&] { io::TsvClassificationDataset(tok, d / "cola.tsv", 8); }),
                 "cola.tsv: every line has 4 tab-separated columns and there is no header line"));
  // A line holding only a CR (a \r\r\n file from Windows' csv writer) is blank.
  std::ofstream(d / "crcr.tsv") << "pos\thello\r\r\n\r\r\nneg\tworld\r\r\n";
  CHECK(io::TsvClassificationDataset(tok, d / "crcr.tsv", 8).size() == 2);
}

TEST_CASE("tsv classification: byte order mark, CR line ends, blank lines, spaced labels") {
  TempDir d("kiln_tsv");
  auto tok = toy_tokenizer();
  std::ofstream(d / "bom.tsv") << "\xEF\xBB\xBFlabel\ttext\npos\thello\nneg\tworld\n";
  CHECK(io::TsvClassificationDataset(tok, d / "bom.tsv", 8).label_names() == Words{"neg", "pos"});
  std::ofstream(d / "bom2.tsv") << "\xEF\xBB\xBFpos\thello\nneg\tworld\npos\trun\n";
  CHECK(io::TsvClassificationDataset(tok, d / "bom2.tsv", 8).label_names() == Words{"neg", "pos"});
  std::ofstream(d / "cr.tsv") << "pos\thello\rneg\tworld\rpos\trun\r";  // old Mac line ends
  io::TsvClassificationDataset cr(tok, d / "cr.tsv", 8);
  CHECK(tsv_samples(cr, *tok) == Samples{{"pos", "hello"}, {"neg", "world"}, {"pos", "run"}});
  // A CR inside a field of an LF file is content, not a line end.
  std::ofstream(d / "crfield.tsv") << "pos\thello\rworld\r\nneg\trun\n";
  io::TsvClassificationDataset crfield(tok, d / "crfield.tsv", 8);
  CHECK(crfield.size() == 2);
  CHECK(tsv_text(crfield, *tok, 0) == Words{"hello", "world"});
  std::ofstream(d / "blank.tsv") << "pos\thello\n   \n\t\n\npos \tworld\n neg\trun\n";
  io::TsvClassificationDataset blank(tok, d / "blank.tsv", 8);
  CHECK(tsv_samples(blank, *tok) == Samples{{"pos", "hello"}, {"pos", "world"}, {"neg", "run"}});
}

TEST_CASE("tsv classification: errors name the line; integer labels in numeric order") {
  TempDir d("kiln_tsv");
  auto tok = toy_tokenizer();
  // Errors name the line of the file, blank lines counted.
  std::ofstream(d / "gap.tsv") << "pos\thello\n\nneg\tworld\n\nmaybe\trun\n";
  CHECK(contains(error_of([&] {
                   io::TsvClassificationDataset(tok, d / "gap.tsv", 8, {"neg", "pos"});
                 }),
                 "gap.tsv:5: the label 'maybe'"));
  std::ofstream(d / "empty.tsv") << "pos\thello\n \tworld\n";
  CHECK(contains(error_of([&] { io::TsvClassificationDataset(tok, d / "empty.tsv", 8); }),
                 "empty.tsv:2: the label (column 1) is empty"));
  // Integer labels in numeric order: label "2" is class 2.
  std::ofstream(d / "int.tsv") << "10\ta\n2\tb\n0\tc\n1\thello\n3\tworld\n-1\trun\n";
  io::TsvClassificationDataset ints(tok, d / "int.tsv", 8);
  CHECK(ints.label_names() == Words{"-1", "0", "1", "2", "3", "10"});
  CHECK(ints.get_batch({1}, 0).at("target").data<int64_t>()[0] == 3);
  // Names fixed by a trained model keep their order (text order from an older build, say).
  io::TsvClassificationDataset old(tok, d / "int.tsv", 8, {"-1", "0", "1", "10", "2", "3"});
  CHECK(old.get_batch({1}, 0).at("target").data<int64_t>()[0] == 4);
}

TEST_CASE("vocab and masked LM: a byte order mark, CR line ends and binary files") {
  TempDir d("kiln_vocab");
  std::ofstream(d / "bom.txt") << "\xEF\xBB\xBF[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n";
  const io::Vocab v = io::Vocab::load(d / "bom.txt");
  CHECK(v.id("[PAD]") == 0);
  CHECK(v.id("hello") == 5);
  std::ofstream(d / "cr.txt") << "[PAD]\r[UNK]\r[CLS]\r[SEP]\r[MASK]\rhello\r";
  CHECK(io::Vocab::load(d / "cr.txt").id("hello") == 5);
  auto tok = toy_tokenizer();
  // A corpus with CR line ends: lines, so a blank line still ends a document.
  std::ofstream(d / "cr_corpus.txt") << "\xEF\xBB\xBFhello world\r\rthe a b\r";
  io::MlmDataset ds(tok, {d / "cr_corpus.txt"}, {16, 0.15});
  CHECK(ds.size() == 2);
  CHECK(ds.tokens() == 5);
  // A lone CR ends a line only in a file without LF; elsewhere it is content. split_lines keeps a byte
  // order mark (read_text_file drops a file's).
  using Lines = std::vector<std::string_view>;
  CHECK(io::split_lines("a\r\nb\rc\n\nd") == Lines{"a", "b\rc", "", "d"});
  CHECK(io::split_lines("a\rb\r\rc") == Lines{"a", "b", "", "c"});
  CHECK(io::split_lines("\xEF\xBB\xBF"
                        "a\n") == Lines{"\xEF\xBB\xBF"
                                        "a"});
  {
    std::ofstream f(d / "bin.dat", std::ios::binary);
    f << "hello" << '\0' << "world\n";
  }
  CHECK(contains(error_of([&] {
                   io::MlmDataset(tok, {d / "bin.dat"}, {16, 0.15});
                 }),
                 "bin.dat: binary data (a NUL byte at offset 5), not a text file"));
}

TEST_CASE("vocab and masked LM: bytes that are not UTF-8 are counted and named once per file, not fatal") {
  TempDir d("kiln_vocab");
  {
    std::ofstream f(d / "latin1.txt", std::ios::binary);
    for (int i = 0; i < 50; ++i) f << "the quick brown fox jumps over the lazy dog\n";
    f << "caf\xe9 na\xefve\n";  // Latin-1: two bytes that are not UTF-8
  }
  auto r =
      kiln::testing::run_kiln("vocab --text " + d / "latin1.txt" + " --size 60 --out " + d / "v.txt", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  const std::string says = d / "latin1.txt" + ": 2 bytes are not valid UTF-8";
  CHECK_MESSAGE(contains(r.output, says), r.output);
  CHECK(r.output.find(says) == r.output.rfind(says));  // once for the file
  r = kiln::testing::run_kiln("vocab --text " + d / "v.txt" + " --size 60 --out " + d / "v2.txt", d.p.string());
  CHECK_MESSAGE(!contains(r.output, "UTF-8"), r.output);  // a clean file: nothing said
}

TEST_CASE("text directories: symbolic links followed, sub-directories walked, a named binary file refused") {
  namespace fs = std::filesystem;
  TempDir d("kiln_textdir");
  // A Hugging Face cache snapshot: the files are links into blobs/, one in a sub-directory.
  fs::create_directories(d.p / "blobs");
  fs::create_directories(d.p / "snap" / "sub");
  fs::create_directories(d.p / "snap" / ".git");
  for (int i = 0; i < 3; ++i) {
    std::ofstream f(d / ("blobs/b" + std::to_string(i)));
    for (int k = 0; k < 20; ++k) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  fs::create_symlink(d.p / "blobs" / "b0", d.p / "snap" / "a.txt");
  fs::create_symlink(d.p / "blobs" / "b1", d.p / "snap" / "sub" / "b.txt");
  fs::create_symlink(d.p / "blobs" / "b0", d.p / "snap" / "a.u8");  // the same file twice: read once
  fs::create_symlink(d.p / "blobs", d.p / "snap" / "linked_dir");   // a link to a directory: not walked
  std::ofstream(d / "snap/.git/HEAD") << "ref: refs/heads/main\n";  // hidden: left out
  auto r = kiln::testing::run_kiln("vocab --text " + d / "snap" + " --size 60 --out " + d / "v.txt", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "from 2 files"), r.output);
  {
    std::ofstream f(d / "bin.dat", std::ios::binary);
    f << "the quick" << '\0' << "brown fox\n";
  }
  r = kiln::testing::run_kiln("vocab --text " + d / "bin.dat" + " --size 60 --out " + d / "v2.txt", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "--text " + d / "bin.dat" + ": binary data (a NUL byte in its first 4 KiB)"),
                r.output);
}

TEST_CASE("text directories: a .gz is judged by what it holds: text read, binary (data.tar.gz) skipped") {
  namespace fs = std::filesystem;
  TempDir d("kiln_textdir");
  fs::create_directories(d.p / "corpus");
  std::string text;
  for (int k = 0; k < 20; ++k) text += "the quick brown fox jumps over the lazy dog\n";
  std::ofstream(d / "corpus/a.txt") << text;
  write_gzip(d / "corpus/b.txt.gz", text);
  std::string tar = "data/" + std::string(200, '\0') + "0000644" + std::string(300, '\0') + text;
  write_gzip(d / "corpus/data.tar.gz", tar);
  // The one test, on decompressed bytes: the walk and read_text_file agree.
  CHECK(io::binary_offset(tar) == 5);
  CHECK(io::file_binary_offset(d / "corpus/data.tar.gz") == 5);
  CHECK(io::file_binary_offset(d / "corpus/b.txt.gz") == std::string::npos);
  CHECK(io::file_binary_offset(d / "corpus/a.txt") == std::string::npos);
  auto r = kiln::testing::run_kiln("vocab --text " + d / "corpus" + " --size 60 --out " + d / "v.txt", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "from 2 files"), r.output);
  // Named itself, the binary .gz is an error before any reading.
  r = kiln::testing::run_kiln("vocab --text " + d / "corpus/data.tar.gz" + " --size 60 --out " + d / "v2.txt",
                              d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "--text " + d / "corpus/data.tar.gz" + ": binary data"), r.output);
}

TEST_CASE("kiln train --task mlm refuses --label-smoothing, which only the classification loss uses") {
  TempDir d("kiln_mlm_ls");
  std::ofstream(d / "c.txt") << "hello world\n";
  std::ofstream(d / "v.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n";
  const auto r = kiln::testing::run_kiln("train --model bert-tiny --task mlm --text " + d / "c.txt" + " --vocab " +
                                             d / "v.txt" + " --label-smoothing 0.1 --out " + d / "run",
                                         d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "--label-smoothing 0.100000: applies to the classification loss"), r.output);
  CHECK(!std::filesystem::exists(d.p / "run" / "metrics.jsonl"));
}

TEST_CASE("kiln eval of a BERT classifier takes the label names from its weights: no --train-tsv needed") {
  TempDir d("kiln_tsv_eval");
  std::ofstream(d / "v.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\nthe\nruns\n";
  // GLUE's layout with integer labels: numeric order, so "10" is the last class.
  std::ofstream(d / "train.tsv") << "sentence\tlabel\nhello world\t1\nthe runs\t0\nhello\t10\nworld\t2\n";
  const std::string common = " --model bert-tiny --task classify --vocab " + d / "v.txt" +
                             " --seq-len 16 --batch 2 --threads 1 --eval-tsv " + d / "train.tsv";
  auto r = kiln::testing::run_kiln(
      "train" + common + " --train-tsv " + d / "train.tsv" + " --max-steps 1 --out " + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto s = nlohmann::json::parse(kiln::testing::read_text(d / "run/summary.json"));
  CHECK(s["config"]["data_info"]["labels"] == nlohmann::json({"0", "1", "2", "10"}));
  r = kiln::testing::run_kiln("eval" + common + " --weights " + d / "run/model.safetensors" + " --out " + d / "e.json",
                              d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto e = nlohmann::json::parse(kiln::testing::read_text(d / "e.json"));
  CHECK(e["test_loss"].get<double>() == doctest::Approx(s["test_loss"].get<double>()).epsilon(1e-6));
  CHECK(e["data"]["labels"] == s["config"]["data_info"]["labels"]);
}

TEST_CASE(
    "kiln eval of a BERT model tokenizes as it was trained: --lower-case, --seq-len and the vocab from its weights") {
  TempDir d("kiln_tsv_text_meta");
  std::ofstream(d / "v.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nHello\nworld\nWorld\nthe\n";
  std::ofstream(d / "other.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nHello\nworld\nWorld\nThe\n";
  std::ofstream(d / "train.tsv") << "label\tsentence\n1\tHello World\n0\thello world\n1\tthe World\n0\tThe hello\n";
  const std::string data = " --model bert-tiny --task classify --vocab " + d / "v.txt" +
                           " --batch 2 --threads 1 --eval-tsv " + d / "train.tsv";
  auto r = kiln::testing::run_kiln("train" + data + " --no-lower-case --seq-len 12 --train-tsv " + d / "train.tsv" +
                                       " --max-steps 2 --lr 1e-2 --out " + d / "run",
                                   d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto s = nlohmann::json::parse(kiln::testing::read_text(d / "run/summary.json"));
  const std::string w = " --weights " + d / "run/model.safetensors";
  const auto f = io::load_safetensors(d / "run/model.safetensors");
  CHECK(f.metadata.at("lower_case") == "false");
  CHECK(f.metadata.at("seq_len") == "12");
  CHECK(f.metadata.at("vocab_size") == "10");
  // No text flags: the trained ones, so the same loss as the run's own evaluation.
  r = kiln::testing::run_kiln("eval" + data + w + " --out " + d / "e.json", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  auto e = nlohmann::json::parse(kiln::testing::read_text(d / "e.json"));
  CHECK(e["data"]["lower_case"] == false);
  CHECK(e["data"]["seq_len"] == 12);
  CHECK(e["test_loss"].get<double>() == doctest::Approx(s["test_loss"].get<double>()).epsilon(1e-6));
  // The trained setting given again is fine; its opposite is an error naming both.
  r = kiln::testing::run_kiln("eval" + data + w + " --no-lower-case", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  r = kiln::testing::run_kiln("eval" + data + w + " --lower-case", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(
      contains(r.output, "--lower-case: " + d / "run/model.safetensors" + " was trained with --no-lower-case"),
      r.output);
  // Another length is a choice (longer texts), said once.
  r = kiln::testing::run_kiln("eval" + data + w + " --seq-len 16", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "warning: --seq-len 16, but " + d / "run/model.safetensors" +
                                       " was trained with --seq-len 12"),
                r.output);
  // A vocabulary of the same size with another token gives other ids: refused.
  r = kiln::testing::run_kiln("eval --model bert-tiny --task classify --vocab " + d / "other.txt" +
                                  " --batch 2 --threads 1 --eval-tsv " + d / "train.tsv" + w,
                              d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "--vocab " + d / "other.txt" + " (10 tokens) is not the vocabulary"), r.output);
  // Weights from before the text settings were stored: the flags as given (lower-cased by default).
  std::map<std::string, std::string> old_meta = f.metadata;
  for (const char* k : {"lower_case", "seq_len", "vocab", "vocab_size", "vocab_fingerprint"}) old_meta.erase(k);
  io::save_safetensors(d / "old.safetensors", f.tensors, old_meta);
  r = kiln::testing::run_kiln("eval" + data + " --weights " + d / "old.safetensors" + " --out " + d / "o.json",
                              d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  e = nlohmann::json::parse(kiln::testing::read_text(d / "o.json"));
  CHECK(e["data"]["lower_case"] == true);
  CHECK(e["data"]["seq_len"] == 128);
}

namespace {
// The vocabulary Hugging Face's answers below were computed with (BertTokenizer over this vocab.txt).
std::shared_ptr<io::WordPieceTokenizer> pair_tokenizer() {
  Words t = io::kBertSpecialTokens;
  for (const char* w : {"hello", "world", "the", "cat", "sat", "on",  "mat", "a",      "dog", "ran", ".",
                        ",",     "!",     "?",   "'",   "s",   "run", "##s", "##ning", "is",  "it"})
    t.push_back(w);
  return std::make_shared<io::WordPieceTokenizer>(io::Vocab::from_tokens(t, "pair vocab"));
}
struct Encoded {
  std::vector<int64_t> ids, types;
};
// Sample 0 of `ds` without its padding (checked to be [PAD] of type 0).
Encoded first_encoded(const io::TsvClassificationDataset& ds) {
  const io::Batch b = ds.get_batch({0}, 0);
  const int64_t n = b.at("input_ids").numel();
  Encoded e;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t id = b.at("input_ids").data<int64_t>()[j], type = b.at("token_type_ids").data<int64_t>()[j];
    if (b.at("attention_mask").data<int64_t>()[j] == 0) {
      CHECK(id == 0);
      CHECK(type == 0);
      continue;
    }
    e.ids.push_back(id);
    e.types.push_back(type);
  }
  return e;
}
}  // namespace

TEST_CASE("tsv classification: sentence pairs encode as Hugging Face's tokenizer(a, b), cut 'longest_first'") {
  TempDir d("kiln_tsv_pairs");
  auto tok = pair_tokenizer();
  using Ids = std::vector<int64_t>;
  struct Case {
    std::string a, b;
    int64_t seq_len;
    Ids ids, types;  // transformers 5.25 BertTokenizer(a, b, max_length=seq_len, truncation=True)
  };
  const Case cases[] = {
      {"hello world", "the cat sat", 16, {2, 5, 6, 3, 7, 8, 9, 3}, {0, 0, 0, 0, 1, 1, 1, 1}},
      {"The cat sat on the mat.",
       "a dog ran!",
       16,
       {2, 7, 8, 9, 10, 7, 11, 15, 3, 12, 13, 14, 17, 3},
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}},
      {"runs running zzz", "it is", 16, {2, 21, 22, 21, 23, 1, 3, 25, 24, 3}, {0, 0, 0, 0, 0, 0, 0, 1, 1, 1}},
      // Both cut: the shorter (5 of 6) to half the 7 tokens of room, the longer to the rest.
      {"hello world hello world hello",
       "the cat sat on the mat",
       10,
       {2, 5, 6, 5, 3, 7, 8, 9, 10, 3},
       {0, 0, 0, 0, 0, 1, 1, 1, 1, 1}},
      // A tie: the first to half (3), the second to the rest (4).
      {"hello world hello world hello",
       "the cat sat on the",
       10,
       {2, 5, 6, 5, 3, 7, 8, 9, 10, 3},
       {0, 0, 0, 0, 0, 1, 1, 1, 1, 1}},
      {"hello world hello world hello",
       "the cat sat on the mat",
       11,
       {2, 5, 6, 5, 6, 3, 7, 8, 9, 10, 3},
       {0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}},
      // Only the longer cut, first or second.
      {"hello world hello world hello world hello",
       "the cat",
       9,
       {2, 5, 6, 5, 6, 3, 7, 8, 3},
       {0, 0, 0, 0, 0, 0, 1, 1, 1}},
      {"the cat",
       "hello world hello world hello world hello",
       9,
       {2, 7, 8, 3, 5, 6, 5, 6, 3},
       {0, 0, 0, 0, 1, 1, 1, 1, 1}},
  };
  for (const Case& c : cases) {
    std::ofstream(d / "p.tsv") << "sentence1\tsentence2\tlabel\n" << c.a << "\t" << c.b << "\t1\n";
    const io::TsvClassificationDataset ds(tok, d / "p.tsv", c.seq_len);
    CHECK(ds.text_columns() == Words{"sentence1", "sentence2"});
    const Encoded e = first_encoded(ds);
    CHECK_MESSAGE(e.ids == c.ids, c.a, " | ", c.b);
    CHECK_MESSAGE(e.types == c.types, c.a, " | ", c.b);
  }
  // GLUE's headers: the pair named, whatever else the file holds (QNLI's 'sentence' is its second text).
  struct Header {
    std::string file;
    Words taken;
  };
  const Header headers[] = {
      {"index\tquestion\tsentence\tlabel\n0\thello world\tthe cat sat\tentailment\n", {"question", "sentence"}},
      {"id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n0\t1\t2\thello world\tthe cat sat\t1\n",
       {"question1", "question2"}},
      {"Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t7\t8\thello world\tthe cat sat\n", {"#1 String", "#2 String"}},
      {"premise\thypothesis\tlabel\nhello world\tthe cat sat\t0\n", {"premise", "hypothesis"}},
      {"label\tfirst\tsecond\n0\thello world\tthe cat sat\n", {"first", "second"}},  // two others: in file order
      {"idx\tsentence1\tsentence2\tlabel\n0\thello world\tthe cat sat\t0\n", {"sentence1", "sentence2"}},
  };
  for (const Header& h : headers) {
    std::ofstream(d / "h.tsv") << h.file;
    const io::TsvClassificationDataset ds(tok, d / "h.tsv", 16);
    CHECK_MESSAGE(ds.text_columns() == h.taken, h.file);
    CHECK_MESSAGE(first_encoded(ds).ids == Ids({2, 5, 6, 3, 7, 8, 9, 3}), h.file);
  }
  // The second text last: a row's extra tabs stay in it. A single text keeps type 0 throughout.
  std::ofstream(d / "tab.tsv") << "label\tsentence1\tsentence2\n0\thello\tthe\tcat\n";
  CHECK(first_encoded(io::TsvClassificationDataset(tok, d / "tab.tsv", 16)).ids == Ids({2, 5, 3, 7, 8, 3}));
  std::ofstream(d / "one.tsv") << "label\tsentence\n0\thello world\n";
  const Encoded one = first_encoded(io::TsvClassificationDataset(tok, d / "one.tsv", 16));
  CHECK(one.types == Ids({0, 0, 0, 0}));
}

TEST_CASE("kiln train --task classify on sentence pairs (GLUE's sentence1<TAB>sentence2<TAB>label) learns") {
  TempDir d("kiln_tsv_pair_train");
  std::ofstream(d / "v.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\nthe\ncat\n";
  // The label is whether the two texts are the same: only the pair tells.
  std::ofstream tsv(d / "train.tsv");
  tsv << "idx\tsentence1\tsentence2\tlabel\n";
  const char* words[] = {"hello", "world", "the", "cat"};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) tsv << i * 4 + j << "\t" << words[i] << "\t" << words[j] << "\t" << (i == j) << "\n";
  tsv.close();
  auto r = kiln::testing::run_kiln("train --model bert-tiny --task classify --vocab " + d / "v.txt" + " --train-tsv " +
                                       d / "train.tsv" + " --eval-tsv " + d / "train.tsv" +
                                       " --seq-len 8 --batch 16 --epochs 60 --lr 3e-3 --warmup 0 --log-every 1 "
                                       "--threads 1 --out " +
                                       d / "run",
                                   d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto s = nlohmann::json::parse(kiln::testing::read_text(d / "run/summary.json"));
  CHECK(s["config"]["data_info"]["text_columns"] == nlohmann::json({"sentence1", "sentence2"}));
  // From ln 2 = 0.69 (0.56 after a step: 3 in 4 pairs differ) to ~0.27 in 60 steps (measured), past
  // what always answering "differ" scores (0.75).
  CHECK_MESSAGE(s["test_loss"].get<double>() < 0.4, s["test_loss"]);
  CHECK_MESSAGE(s["test_accuracy"].get<double>() > 0.75, s["test_accuracy"]);
}

TEST_CASE("masked LM: [UNK] is never a target (as Hugging Face's collator), unless a sequence holds nothing else") {
  TempDir d("kiln_mlm_unk");
  auto tok = toy_tokenizer();
  {
    std::ofstream f(d / "corpus.txt");
    for (int i = 0; i < 200; ++i) f << "zzz hello zzz world qqq the\n%\n";
    f << "zzz qqq\n";  // only [UNK]s: its one target is an [UNK]
  }
  io::MlmDataset ds(tok, {d / "corpus.txt"}, {8, 0.5});
  REQUIRE(ds.size() == 201);
  std::vector<int64_t> all(size_t(ds.size()));
  for (int64_t i = 0; i < ds.size(); ++i) all[size_t(i)] = i;
  int64_t targets = 0;
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const io::Batch b = ds.get_batch(all, seed);
    const int64_t* x = b.at("input_ids").data<int64_t>();
    const int64_t* l = b.at("labels").data<int64_t>();
    for (int64_t i = 0; i + 1 < ds.size(); ++i)
      for (int64_t j = 0; j < 8; ++j) {
        // [CLS] [UNK] hello [UNK] world [UNK] the [SEP]
        if (j == 1 || j == 3 || j == 5) {
          CHECK(l[i * 8 + j] == -100);
          CHECK(x[i * 8 + j] == tok->unk_id);
        }
        targets += l[i * 8 + j] != -100;
      }
    const int64_t last = ds.size() - 1;
    CHECK(std::count_if(l + last * 8, l + last * 8 + 8, [](int64_t v) { return v != -100; }) == 1);
  }
  CHECK(targets > 0);
}

TEST_CASE("masked LM: special tokens written in the text are never targets either") {
  TempDir d("kiln_mlm_special");
  auto tok = toy_tokenizer();
  {
    std::ofstream f(d / "corpus.txt");
    for (int i = 0; i < 200; ++i) f << "hello [SEP] world [MASK] the [CLS]\n%\n";
  }
  io::MlmDataset ds(tok, {d / "corpus.txt"}, {8, 0.5});
  std::vector<int64_t> all(size_t(ds.size()));
  for (int64_t i = 0; i < ds.size(); ++i) all[size_t(i)] = i;
  int64_t targets = 0;
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const io::Batch b = ds.get_batch(all, seed);
    const int64_t* x = b.at("input_ids").data<int64_t>();
    const int64_t* l = b.at("labels").data<int64_t>();
    for (int64_t i = 0; i < ds.size(); ++i) {
      // [CLS] hello [SEP] world [MASK] the [CLS] [SEP]
      REQUIRE(x[i * 8 + 2] == tok->sep_id);
      for (int64_t j : {2, 4, 6}) CHECK(l[i * 8 + j] == -100);
      for (int64_t j : {1, 3, 5}) targets += l[i * 8 + j] != -100;
    }
  }
  CHECK(targets > 0);
}

TEST_CASE("unicode: the ASCII class table agrees with the Unicode tables") {
  for (char32_t c = 0; c < 128; ++c) {
    CAPTURE(int(c));
    const uint8_t k = io::unicode::kAsciiClass[c];
    CHECK(bool(k & io::unicode::kAsciiControl) == io::unicode::is_control(c));
    CHECK(bool(k & io::unicode::kAsciiWhitespace) == io::unicode::is_whitespace(c));
    CHECK(bool(k & io::unicode::kAsciiPunctuation) == io::unicode::is_punctuation(c));
  }
}

namespace {
// BERT's basic tokenizer written straight from its steps with io/unicode.h, every character through
// the Unicode tables: what basic_tokenize's ASCII short cuts and reused buffers must reproduce.
Words reference_basic_tokenize(const std::u32string& text, const io::BasicTokenizerOptions& o) {
  namespace u = io::unicode;
  Words out;
  auto split_word = [&](std::u32string word) {
    if (o.lower_case) word = u::to_lower(word);
    if (o.strip_accents) {
      std::u32string kept;
      for (const char32_t c : u::nfd(word))
        if (!u::is_nonspacing_mark(c)) kept.push_back(c);
      word = kept;
    }
    std::u32string piece;
    for (const char32_t c : word) {
      if (!u::is_punctuation(c)) {
        piece.push_back(c);
        continue;
      }
      if (!piece.empty()) out.push_back(io::encode_utf8(piece));
      piece.clear();
      out.push_back(io::encode_utf8(std::u32string(1, c)));
    }
    if (!piece.empty()) out.push_back(io::encode_utf8(piece));
  };
  std::u32string word;
  auto flush = [&] {
    if (!word.empty()) split_word(word);
    word.clear();
  };
  for (const char32_t c : text) {
    if (u::is_control(c)) continue;
    if (u::is_whitespace(c)) {
      flush();
    } else if (u::is_chinese_char(c)) {
      flush();
      word.push_back(c);
      flush();
    } else {
      word.push_back(c);
    }
  }
  flush();
  return out;
}
}  // namespace

TEST_CASE("basic tokenizer: mixed ASCII and non-ASCII words match the character-by-character reference") {
  // Accented and Greek words against ASCII punctuation, a final sigma before ".", marks to reorder.
  CHECK(io::basic_tokenize("(Caf\xc3\xa9), na\xc3\xafve! \xce\x9f\xce\x94\xce\x9f\xce\xa3. \"CAF\xc3\x89\"") ==
        Words{"(", "cafe", ")", ",", "naive", "!", "οδος", ".", "\"", "cafe", "\""});
  CHECK(io::basic_tokenize("Caf\xc3\xa9, na\xc3\xafve!", {false, false}) ==
        Words{"Caf\xc3\xa9", ",", "na\xc3\xafve", "!"});
  CHECK(io::basic_tokenize("Caf\xc3\xa9, Na\xc3\xafve!", {true, false}) ==
        Words{"caf\xc3\xa9", ",", "na\xc3\xafve", "!"});
  CHECK(io::basic_tokenize("Caf\xc3\xa9, Na\xc3\xafve!", {false, true}) == Words{"Cafe", ",", "Naive", "!"});

  // Random strings drawn from ASCII (letters, digits, punctuation, spaces, controls) and from letters
  // that lower-case, decompose, combine, end a word with sigma, are CJK, punctuation or whitespace.
  const std::u32string pool =
      U"aZq9 \t\n\x01\x7f.,-'$[]AEIOU\u00c9\u00e9\u00ef\u00c5\u0130\u03a3\u039f\u0394\u0301\u0316\u0308\u00ab\u00bb"
      U"\u2014\u00a0\u3000\u4e2d\uac00\u1100\u00df\ufb01\u200b\ue000\u0928\u093c\u0964\uff21\u212b";
  const std::vector<io::BasicTokenizerOptions> options = {{true, true}, {false, false}, {true, false}, {false, true}};
  uint64_t state = 12345;
  for (int n = 0; n < 2000; ++n) {
    std::u32string text;
    const int len = int(state % 24);
    for (int i = 0; i < len; ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      // ASCII letters most of the time, as in real text, so that words mix both kinds.
      const uint64_t r = state >> 33;
      text.push_back(r % 3 ? pool[r % 4] : pool[r / 3 % pool.size()]);
    }
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const std::string utf8 = io::encode_utf8(text);
    for (const auto& o : options) {
      CAPTURE(utf8);
      CHECK(io::basic_tokenize(utf8, o) == reference_basic_tokenize(text, o));
    }
  }
}

// A TSV line of 30 MB with --seq-len 16 took 9 s and 1.1 GB: every token of the text was made, then all
// but the sequence's dropped. Now a text is read only as far as the tokens kept: they must be the
// whole text's first ones, the pair's cut the one the whole texts' lengths give, and the non-ASCII
// runs, now decoded in pieces, must decode as the whole text.
TEST_CASE("tokenizer: a text read only as far as max_tokens gives the whole text's first tokens") {
  auto tok = pair_tokenizer();
  const std::string texts[] = {"hello world [MASK] the cat sat on the mat.",
                               "runs running zzz [SEP]x[PAD] hello[CLS]world",
                               "\xe4\xb8\xad\xe6\x96\x87 the\xe4\xb8\xad cat, Caf\xc3\xa9 a\xff b \xe2\x82 hello",
                               "",
                               "[MASK][MASK] [UNK]",
                               "   the   "};
  for (const std::string& text : texts) {
    const Words all = tok->tokenize(text);
    const std::vector<int64_t> ids = tok->encode(text);
    for (size_t k = 0; k <= all.size() + 2; ++k) {
      CAPTURE(text);
      CAPTURE(k);
      CHECK(tok->tokenize(text, k) == Words(all.begin(), all.begin() + std::ptrdiff_t(std::min(k, all.size()))));
      CHECK(tok->encode(text, k) ==
            std::vector<int64_t>(ids.begin(), ids.begin() + std::ptrdiff_t(std::min(k, ids.size()))));
      CHECK(tok->count(text, k) == std::min(k, all.size()));
    }
    CHECK(tok->count(text) == all.size());
  }
  // Runs of non-ASCII bytes longer than the 4 KiB pieces they are decoded in: two-, three- and
  // four-byte characters, stray continuation bytes and sequences cut short, across the cuts.
  const std::string bits[] = {"\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\x80",     "\x80\x80\x80\x80\x80",
                              "\xe2\x82", "\xf0\x9f",     "\xce\xa3",         "\xc2\xa0", "\xff"};
  uint64_t state = 7;
  for (int n = 0; n < 40; ++n) {
    std::string text;
    while (text.size() < 9000) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      text += bits[(state >> 33) % std::size(bits)];
      if ((state >> 40) % 97 == 0) text += " a";
    }
    CHECK(io::basic_tokenize(text) == reference_basic_tokenize(io::decode_utf8(text), {}));
  }
}

TEST_CASE("tsv classification: a long text is cut as its whole tokens would be, one text or a pair") {
  TempDir d("kiln_tsv_long");
  auto tok = pair_tokenizer();
  const auto words = [](const char* w, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
      if (i) s += ' ';
      s += w;
    }
    return s;
  };
  // Lengths around the room (seq_len - 3 for a pair) and far past it: the odd token of an odd room
  // goes to the longer text when both are past it, whichever that is, and to the second on a tie.
  std::vector<std::pair<std::string, std::string>> rows;
  for (const int a : {0, 1, 3, 4, 5, 6, 7, 8, 40, 41, 300})
    for (const int b : {0, 1, 4, 5, 6, 7, 20, 40, 41, 150, 300})  // "the cat" x b: 2b tokens
      rows.emplace_back(words("hello", a), words("the cat", b));
  for (const int64_t seq_len : {8, 9, 10, 11, 16}) {
    std::ofstream out(d / "p.tsv");
    out << "sentence1\tsentence2\tlabel\n";
    for (const auto& [a, b] : rows) out << a << "\t" << b << "\t1\n";
    out.close();
    std::ofstream one(d / "one.tsv");
    for (const auto& r : rows) one << "1\t" << r.first << " " << r.second << "\n";
    one.close();
    const io::TsvClassificationDataset pairs(tok, d / "p.tsv", seq_len), single(tok, d / "one.tsv", seq_len);
    for (size_t i = 0; i < rows.size(); ++i) {
      CAPTURE(seq_len);
      CAPTURE(i);
      // The reference: every token made, then cut.
      std::vector<int64_t> a = tok->encode(rows[i].first), b = tok->encode(rows[i].second);
      const auto [na, nb] = io::longest_first(a.size(), b.size(), size_t(seq_len - 3));
      std::vector<int64_t> want = {tok->cls_id};
      want.insert(want.end(), a.begin(), a.begin() + std::ptrdiff_t(na));
      want.push_back(tok->sep_id);
      want.insert(want.end(), b.begin(), b.begin() + std::ptrdiff_t(nb));
      want.push_back(tok->sep_id);
      const io::Batch got = pairs.get_batch({int64_t(i)}, 0);
      std::vector<int64_t> ids;
      for (int64_t j = 0; j < seq_len; ++j)
        if (got.at("attention_mask").data<int64_t>()[j]) ids.push_back(got.at("input_ids").data<int64_t>()[j]);
      CHECK(ids == want);
      std::vector<int64_t> whole = tok->encode(rows[i].first + " " + rows[i].second);
      whole.resize(std::min(whole.size(), size_t(seq_len - 2)));
      whole.insert(whole.begin(), tok->cls_id);
      whole.push_back(tok->sep_id);
      const io::Batch got1 = single.get_batch({int64_t(i)}, 0);
      ids.clear();
      for (int64_t j = 0; j < seq_len; ++j)
        if (got1.at("attention_mask").data<int64_t>()[j]) ids.push_back(got1.at("input_ids").data<int64_t>()[j]);
      CHECK(ids == whole);
    }
  }
}

// A vocabulary line holding a space ("a b") can never match a word (the tokenizer splits there): it
// was taken without a word. Hugging Face's BertTokenizer keeps such a line as a token too (its ids stay
// as the file numbers them), so it is a warning naming the file and line, and the ids are unchanged.
TEST_CASE("vocabulary: a token holding whitespace is a warning naming its line, its id kept") {
  TempDir d("kiln_vocab_space");
  std::ofstream(d / "v.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na b\nhello\nx\ty\n";
  std::optional<io::Vocab> v;
  const std::string said = stderr_of([&] { v = io::Vocab::load(d / "v.txt"); }, d / "err.txt");
  CHECK_MESSAGE(contains(said, "kiln: warning: " + d / "v.txt" + ":6: the token 'a b' holds whitespace"), said);
  CHECK_MESSAGE(contains(said, "it never matches (nor do the 1 other such tokens)"), said);
  CHECK(v->id("hello") == 6);
  CHECK(v->id("a b") == 5);
  std::ofstream(d / "ok.txt") << "[PAD]\n[UNK]\nhello\n";
  CHECK(stderr_of([&] { io::Vocab::load(d / "ok.txt"); }, d / "err.txt").empty());
}
