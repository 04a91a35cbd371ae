// kiln.train: the `kiln train` run itself (tools/cmd_train.cpp), with the command's flags, its
// metrics streamed to a Python callback, and SIGINT (a notebook's interrupt) handled as the command
// handles it: save a checkpoint, then stop; kiln.train then raises KeyboardInterrupt.
#include <nanobind/stl/function.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common.h"
#include "io/atomic_file.h"
#include "tools/report.h"
#include "tools/train.h"

namespace kiln::py {
namespace {

nb::object to_python(const nlohmann::json& j) {
  nb::module_ json = nb::module_::import_("json");
  return json.attr("loads")(j.dump());
}

}  // namespace

void bind_train(nb::module_& m) {
  m.def(
      "_train",
      [](const std::vector<std::string>& args, nb::object callback) {
        CLI::App app{"kiln train"};
        tools::TrainConfig c;
        tools::add_train_flags(app, c);
        try {
          std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 takes them last first
          app.parse(rev);
          if (!c.config_file.empty()) tools::apply_json_config(app, c.config_file);
          tools::apply_model_defaults(app, c);
        } catch (const CLI::ParseError& e) {
          value_error(std::string("kiln.train: ") + e.what());
        } catch (const Error& e) {
          value_error(std::string("kiln.train: ") + e.message());
        }
        std::vector<std::string> errors;
        bool stop_from_callback = false;
        std::shared_ptr<PyRef> cb = callback.is_none() ? nullptr : hold(callback);
        tools::TrainHooks hooks;
        hooks.exit_on_second_interrupt = false;
        hooks.on_error = [&errors](const std::string& msg) { errors.push_back(msg); };
        if (cb) {
          hooks.on_metrics = [cb, &stop_from_callback](const nlohmann::json& j) {
            nb::gil_scoped_acquire gil;
            nb::object r = cb->obj(to_python(j));
            if (!r.is_none() && !nb::cast<bool>(r)) stop_from_callback = true;
          };
          hooks.stop_requested = [&stop_from_callback] { return stop_from_callback; };
        }
        tools::TrainOutcome outcome;
        int rc;
        {
          nb::gil_scoped_release nogil;
          rc = tools::run_train(c, hooks, &outcome);
        }
        nb::dict out;
        out["returncode"] = rc;
        out["stop_signal"] = outcome.stop_signal;
        out["stopped_by_callback"] = outcome.stop_asked;
        out["saved"] = outcome.saved;
        out["errors"] = nb::cast(errors);
        out["out"] = c.out;
        return out;
      },
      nb::arg("args"), nb::arg("callback").none(),
      "Runs `kiln train ARGS...` in this process; callback(record) gets every metrics line (a dict) and may "
      "return False to save and stop.");

  m.def(
      "_report",
      [](const std::vector<std::string>& inputs, const std::string& title) {
        std::vector<std::string> notes;
        std::string html;
        {
          nb::gil_scoped_release nogil;
          html = tools::render_report(inputs, title, notes);
        }
        return nb::make_tuple(html, notes);
      },
      nb::arg("inputs"), nb::arg("title"), "The page of `kiln report` for run directories and benchmark JSON files.");
}

}  // namespace kiln::py
