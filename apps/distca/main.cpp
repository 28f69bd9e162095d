// distca: the command-line tool. Parses arguments, dispatches to one registered command, and
// is the only place that prints for people and chooses exit codes.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "command.h"

namespace distca::cli {
namespace {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace

bool register_command(Command command) {
  registry().push_back(std::move(command));
  return true;
}

const std::vector<Command>& registered_commands() { return registry(); }

int fail(const Status& status) {
  std::fprintf(stderr, "distca: error: %s\n", status.message().c_str());
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorrupt:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

int fail_input(const std::string& message) {
  std::fprintf(stderr, "distca: error: %s\n", message.c_str());
  return kExitBadInput;
}

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }
bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

}  // namespace distca::cli

int main(int argc, char** argv) {
  using namespace distca::cli;
  CLI::App app{"distca: core attention disaggregation (CAD) for long-context LLM training"};
  app.set_version_flag("--version", DISTCA_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);

  std::vector<Command> commands = registered_commands();
  std::stable_sort(commands.begin(), commands.end(),
                   [](const Command& a, const Command& b) { return a.order < b.order; });

  std::map<std::string, CLI::App*> parents;
  std::vector<std::pair<CLI::App*, std::shared_ptr<Runner>>> runners;
  for (const auto& c : commands) {
    CLI::App* owner = &app;
    if (!c.parent.empty()) {
      auto it = parents.find(c.parent);
      if (it == parents.end()) {
        CLI::App* p = app.add_subcommand(c.parent, "Benchmarks that print figures and ratios against a baseline measured in the same run");
        p->require_subcommand(1);
        it = parents.emplace(c.parent, p).first;
      }
      owner = it->second;
    }
    CLI::App* sub = owner->add_subcommand(c.name, c.description);
    runners.emplace_back(sub, std::make_shared<Runner>(c.setup(*sub)));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    if (msg.empty()) msg = e.get_name();
    std::fprintf(stderr, "distca: error: %s (see --help)\n", msg.c_str());
    return kExitBadInput;
  }
  for (auto& [sub, runner] : runners) {
    if (sub->parsed()) return (*runner)();
  }
  std::fprintf(stderr, "distca: error: no command given (see --help)\n");
  return kExitBadInput;
}
