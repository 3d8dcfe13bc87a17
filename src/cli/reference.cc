#include "cli/reference.h"

#include <string_view>

#include "common/strings.h"

namespace kgpu::cli {
namespace {

// A Markdown table cell: pipes escaped, newlines as spaces, an empty cell as a dash.
std::string Cell(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out.empty() ? "-" : out;
}

void Command(const CLI::App& app, const std::string& path, std::string& out) {
  out += Cat("\n## `", path, "`\n\n");
  if (!app.get_description().empty()) out += Cat(app.get_description(), "\n\n");
  // What --help shows: the options of a named group (CLI11 hides the empty group), --help itself left out.
  const auto options = app.get_options([&](const CLI::Option* o) {
    return !o->get_group().empty() && o != app.get_help_ptr() && o != app.get_help_all_ptr();
  });
  if (!options.empty()) {
    out += "| option | value | environment | default | meaning |\n|---|---|---|---|---|\n";
    for (const CLI::Option* o : options) {
      out += Cat("| `", o->get_name(false, true), "` | ", Cell(o->get_type_name()), " | ",
                 o->get_envname().empty() ? "-" : Cat("`", o->get_envname(), "`"), " | ",
                 o->get_default_str().empty() ? "-" : Cat("`", o->get_default_str(), "`"), " | ",
                 Cell(o->get_description()), " |\n");
    }
  }
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); })) {
    Command(*sub, Cat(path, " ", sub->get_name()), out);
  }
}

}  // namespace

std::string CliReference(const CLI::App& app) {
  std::string out =
      "# kgpu command-line reference\n\n"
      "Generated from kgpu's command table by `kgpu --cli-reference` (`scripts/cli-docs.sh` writes this "
      "page); the test `cli.reference` fails when this page and the binary disagree. Global options may "
      "come before or after the command. Exit codes: README \"Exit codes\".\n";
  Command(app, "kgpu", out);
  return out;
}

}  // namespace kgpu::cli
