// Checks that several commands make on their flags before any work, with one wording each.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::tools {

// "--out X is the input X itself: writing it would replace the file being read; write to another
// path" when `out` (an output flag's value) names the same file as one of `inputs`, compared with
// std::filesystem::equivalent (so another path to the same file, or a link to it, counts); "" when
// it does not or `out` does not exist yet. Every command that reads one file and writes another asks
// this before reading anything.
std::string output_is_input(const std::string& out_flag, const std::string& out,
                            const std::vector<std::string>& inputs);

// "--out F and --safetensors F name the same file: ..." when a command's two outputs `a` and `b`
// (the values of flags `flag_a` and `flag_b`) would be one file: the same path once made canonical
// (neither need exist), or the same existing file (a link to it); "" otherwise or when either is "".
// output_is_input cannot tell: an output that does not exist yet is no input.
std::string same_output(const std::string& flag_a, const std::string& a, const std::string& flag_b,
                        const std::string& b);

// "" when a file can be written at `path` (the value of flag `flag`): not a directory ("... is a
// directory: name the <what>"), in a directory that exists and is writable. Asked before any work,
// so a bad output path is not found after it.
std::string output_file_problem(const std::string& flag, const std::string& path, const std::string& what);

// An on/off flag pair ("--augment,!--no-augment") whose --help line shows the real default:
// "--augment,--no-augment (default: on)". CLI11 writes such a pair as "--augment,--no-augment{false}",
// the {false} being what --no-augment sets, which reads as the default even where it is true; it
// ignores capture_default_str() for flags. `value` holds the default when this is called.
CLI::Option* add_on_off_flag(CLI::App& app, const std::string& names, bool& value, const std::string& help);

// "kiln bench train" for the App of `bench train`, "kiln" for the top level's.
std::string command_path(const CLI::App& app);
// The deepest command of a parsed (or partly parsed) command line: `bench train`'s App for `kiln bench
// train ...`, `top` itself when no command was given.
const CLI::App& deepest_parsed(const CLI::App& top);
// Makes every one-value flag of `app` and of its commands, at any depth, take the last of its values
// when given twice (CLI11's default refuses a repeat): call once every flag is added.
void take_last_value(CLI::App& app);

// true/false (any case) or 1/0: what --set and --config take for a true/false value, and the command
// line for a true/false flag's --flag=VALUE. CLI11 alone also reads yes/no, on/off, enable/disable,
// any integer (2 as true, -1 as false) and some single letters (y, n, t, f).
std::optional<bool> strict_bool(const std::string& s);
// The one line for the first --flag=VALUE among `args` (the command line's words after `kiln`, up to a
// `--`) where --flag is a true/false flag of the command it follows and strict_bool refuses VALUE:
// "kiln train: error: --augment=no: --augment takes true or false (or 1, 0), got 'no' (see kiln train
// --help)"; "" when there is none. `top` is the `kiln` app, before or after parsing.
std::string bad_flag_value(const CLI::App& top, const std::vector<std::string>& args);

// The one line for the words a command was given and takes no flag for (what CLI11's ExtrasError
// reports as "The following arguments were not expected: 1 --zero" and a second line): "kiln train:
// error: --bogus is not a flag of kiln train (see kiln train --help)", or, for a flag of kiln train
// given to kiln eval, "kiln eval: error: --zero is a kiln train flag (training
// only)". `top` is the parsed `kiln` app; `train` is kiln train's, to know its flags; `args` the
// command line's words after `kiln`, to tell words given after a command's `--` from the top level's.
std::string extras_message(const CLI::App& top, const CLI::App& train, const std::vector<std::string>& args);

}  // namespace kiln::tools

namespace kiln::tools {

// Validators for numeric flags whose messages read "--image-size: must be >= 1, got 0" (CLI11's own
// range checks print DBL_MAX as a 300-digit number, and "Value 0 not in range 0.000000 to ..."), and
// that refuse nan and inf. They check the text as a number; the option's own conversion still refuses
// a fraction for an integer flag.
CLI::Validator at_least(double lo);
CLI::Validator between(double lo, double hi);
// An unsigned 64-bit flag (--seed): decimal digits in [0, 2^64). CLI11's own conversion clamps -1 and
// 2^64 + 1 to 2^64 - 1, which would run another seed than the one given.
CLI::Validator u64_number();
// The most --threads a command takes: max(1024, 4 x the CPUs). More threads than that only contend for
// the cores, and each costs a stack and a slot of the process limit (100000 failed to start).
int64_t max_threads();

}  // namespace kiln::tools
