// JSON text that Kiln writes (checkpoint states and manifests, summaries, metrics lines, config
// agreements): a string in it may be a path or value from the command line, which need not be UTF-8
// (--out $'run\xff'). nlohmann's dump() throws type_error.316 on such a string, which failed every
// checkpoint of a run into such a folder; these write each invalid byte as U+FFFD instead.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace kiln::io {

// j.dump(indent), with a string that is not valid UTF-8 written with U+FFFD for each bad byte.
inline std::string dump_json(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// j as a JSON file Kiln wrote gives it back: each string that is not valid UTF-8 with U+FFFD for each bad
// byte. A live value (a config, data_info's classes or labels read from folder and file names) is passed
// through this before it is compared with one read from such a file (a checkpoint's config, another
// rank's broadcast), or a name with a byte that is not UTF-8 differs from its own saved self.
inline nlohmann::json as_written(const nlohmann::json& j) { return nlohmann::json::parse(dump_json(j)); }

// s as a JSON file Kiln wrote gives it back: s itself when it is valid UTF-8, else with U+FFFD for each
// bad byte. What a string read from such a file is compared with (a mirror's owner, --out).
inline std::string as_json_text(const std::string& s) { return as_written(nlohmann::json(s)).get<std::string>(); }

}  // namespace kiln::io
