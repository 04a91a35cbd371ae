// kiln.train: the `kiln train` run itself (tools/cmd_train.cpp), with the command's flags, its
// metrics streamed to a Python callback, and SIGINT (a notebook's interrupt) handled as the command
// handles it: save a checkpoint, then stop; kiln.train then raises KeyboardInterrupt.
#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common.h"
#include "engine/context.h"
#include "engine/random.h"
#include "io/atomic_file.h"
#include "io/json_text.h"
#include "tools/cli_checks.h"
#include "tools/report.h"
#include "tools/train.h"

namespace kiln::py {
namespace {

nb::object to_python(const nlohmann::json& j) {
  nb::module_ json = nb::module_::import_("json");
  return json.attr("loads")(io::dump_json(j));
}

// The run sets the CPU thread count (--threads) and seeds the default generator (--seed), as the
// command's process needs; kiln.train's caller goes on in the same process, so both are put back
// as they were when the run ends, however it ends (a normal return, an error, an interrupt).
class ProcessStateGuard {
 public:
  ProcessStateGuard() : threads_(Context::current().num_threads), generator_(default_generator()) {}
  ~ProcessStateGuard() {
    default_generator() = generator_;
    try {
      Context c = Context::current();
      c.num_threads = threads_;
      c.apply();
    } catch (const Error&) {  // threads_ was in force before, so apply cannot refuse it
    }
  }
  ProcessStateGuard(const ProcessStateGuard&) = delete;
  ProcessStateGuard& operator=(const ProcessStateGuard&) = delete;

 private:
  int threads_;
  Generator generator_;
};

}  // namespace

void bind_train(nb::module_& m) {
  m.def(
      "_train",
      [](const std::vector<std::string>& args, nb::object callback) {
        CLI::App app{"kiln train"};
        tools::TrainConfig c;
        tools::add_train_flags(app, c);
        tools::take_last_value(app);
        try {
          std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 takes them last first
          app.parse(rev);
          // On the command line a flag given twice takes its last value; here a keyword is given once,
          // so a repeat can only come from a list for a one-value option (batch=[8, 16]).
          for (const CLI::Option* o : app.get_options())
            if (o->get_expected_max() <= 1 && o->count() > 1) {
              std::string key = o->get_single_name();
              for (char& ch : key)
                if (ch == '-') ch = '_';
              value_error("kiln.train: " + key + " takes one value, got " + std::to_string(o->count()) + " (a list)");
            }
          tools::finish_train_flags(app, c);
        } catch (const CLI::CallForHelp&) {
          nb::dict out;
          out["help"] = app.help();
          return out;
        } catch (const CLI::CallForAllHelp&) {
          nb::dict out;
          out["help"] = app.help("", CLI::AppFormatMode::All);
          return out;
        } catch (const CLI::ParseError& e) {
          value_error(std::string("kiln.train: ") + e.what());
        } catch (const Error& e) {
          value_error(std::string("kiln.train: ") + e.message());
        }
        std::vector<std::string> errors;
        bool stop_from_callback = false;
        std::string callback_error;
        // An exception the callback raised: the run stops and saves as for False, then it is raised.
        std::shared_ptr<nb::python_error> callback_raised;
        std::shared_ptr<PyRef> cb = callback.is_none() ? nullptr : hold(callback);
        tools::TrainHooks hooks;
        hooks.exit_on_second_interrupt = false;
        hooks.resume_hint = "resume='auto'";
        hooks.on_error = [&errors](const std::string& msg) { errors.push_back(msg); };
        if (cb) {
          hooks.on_metrics = [cb, &stop_from_callback, &callback_error, &callback_raised](const nlohmann::json& j) {
            GilAcquire gil;
            if (callback_raised) return;  // stopping already
            nb::object r;
            try {
              r = cb->obj(to_python(j));
            } catch (nb::python_error& e) {
              callback_raised = std::make_shared<nb::python_error>(std::move(e));
              stop_from_callback = true;
              return;
            }
            if (r.is_none() || r.is(Py_True)) return;
            const std::string tn = py_type_name(r);
            if (tn == "numpy.bool" || tn == "numpy.bool_") r = nb::bool_(PyObject_IsTrue(r.ptr()) == 1);
            if (r.is(Py_True)) return;
            if (r.is(Py_False)) {
              stop_from_callback = true;
              return;
            }
            // Anything else is a mistake more likely than a truth value ("no" and {} are truthy
            // and falsy by accident): stop, and raise once the run has saved.
            if (callback_error.empty())
              callback_error = "kiln.train: the callback returned a " + py_type_name(r) + " (" +
                               str_of(r).substr(0, 60) + "); return None or True to go on, False to save and stop";
            stop_from_callback = true;
          };
          hooks.stop_requested = [&stop_from_callback] { return stop_from_callback; };
        }
        tools::TrainOutcome outcome;
        int rc;
        {
          ProcessStateGuard restore;  // threads and the default generator, as before the run
          GilRelease nogil;
          rc = tools::run_train(c, hooks, &outcome);
        }
        if (callback_raised) {
          callback_raised->restore();  // the callback's own exception, after the run saved
          callback_raised.reset();
          throw nb::python_error();
        }
        if (!callback_error.empty()) type_error(callback_error + " (the run stopped; saved: " + outcome.saved + ")");
        nb::dict out;
        out["returncode"] = rc;
        out["stop_signal"] = outcome.stop_signal;
        out["stopped_by_callback"] = outcome.stop_asked;
        out["saved"] = outcome.saved;
        out["finished"] = outcome.finished;
        out["summary"] = outcome.summary;  // JSON text: rank 0's summary.json, on every rank
        out["errors"] = nb::cast(errors);
        out["out"] = c.out;
        return out;
      },
      nb::arg("args"), nb::arg("callback").none(),
      "Runs `kiln train ARGS...` in this process; callback(record) gets every metrics line (a dict) and may "
      "return False to save and stop.");

  // kiln.train checks its keywords against these before the run: an unknown one is named whatever
  // its value (None included, which otherwise means "the default"), and a flag (an option that takes
  // no value, --augment / --no-augment) must be given a bool (augment=0 would become the stray word
  // "0").
  m.def(
      "_train_options",
      [] {
        CLI::App app{"kiln train"};
        tools::TrainConfig c;
        tools::add_train_flags(app, c);
        std::vector<std::pair<std::string, bool>> out;  // (keyword, takes no value)
        for (const CLI::Option* o : app.get_options())
          for (std::string name : o->get_lnames()) {
            for (char& ch : name)
              if (ch == '-') ch = '_';
            out.emplace_back(name, o->get_expected_max() == 0);
          }
        return out;
      },
      "The keywords of kiln.train (the long flags of `kiln train`), each with whether it is a flag that takes no "
      "value.");

  m.def(
      "_report",
      [](const std::vector<std::string>& inputs, const std::string& title) {
        std::vector<std::string> notes;
        std::string html;
        {
          GilRelease nogil;
          html = tools::render_report(inputs, title, notes);
        }
        return nb::make_tuple(html, notes);
      },
      nb::arg("inputs"), nb::arg("title"), "The page of `kiln report` for run directories and benchmark JSON files.");
}

}  // namespace kiln::py
