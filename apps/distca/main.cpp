// distca: the command-line tool. Parses arguments, dispatches to one registered command, and
// is the only place that prints for people and chooses exit codes.
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

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

namespace {

// Keeps freed buffers of up to 32 MiB in the heap for reuse instead of handing them back to
// the OS. The runtime's per-step buffers (fused Q/K/V, gradients, wire rows) are allocated
// and freed every layer; glibc would otherwise mmap each one afresh, and page-faulting tens of
// megabytes per step cost 5-10 ms of a 0.8 s layer step on this machine (docs/runtime.md).
// The price is that the process keeps its peak heap. A process-wide allocator policy, so the
// application sets it, not a library.
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  using namespace distca::cli;
  keep_freed_memory();
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
