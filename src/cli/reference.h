#pragma once
// The command-line reference (docs/cli.md), generated from the command table itself: every
// command and subcommand with its description and every option it shows in --help (name, value
// type, environment variable, default, meaning). `kgpu --cli-reference` prints it;
// scripts/cli-docs.sh writes docs/cli.md from it and the test cli.reference fails when the page
// and the binary disagree.
//
// Thread-safety: none needed (called once from main, before any command runs).

#include <string>

#include <CLI/CLI.hpp>

namespace kgpu::cli {

std::string CliReference(const CLI::App& app);

}  // namespace kgpu::cli
