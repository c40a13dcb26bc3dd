// The compressor registry is the one list of compressors, and everything
// that must cover every compressor covers exactly that list: each registered
// compressor builds from its spec on 2, 3 and 4 ranks and steps bitwise as
// its typed allreducer, its spec reads back what it writes, its name is its
// folder's, its keys are keys a spec has, and the benchmark rows and the
// README's compressor table hold every one of them.
#include "../bench/common/rows.hpp"
#include "common/compressors.hpp"
#include "common/harness.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

using namespace gradcomp;
using namespace gradcomp::testing;

namespace {

std::set<std::string> registered_names() {
  std::set<std::string> names;
  for_each_registered([&]<class C>(std::type_identity<C>) { names.insert(std::string(C::name)); });
  return names;
}

std::filesystem::path source_dir() { return GRADCOMP_SOURCE_DIR; }

}  // namespace

TEST_CASE("every registered compressor builds from its spec and steps bitwise as its typed allreducer") {
  for_each_registered([&]<class C>(std::type_identity<C>) {
    compressor_spec const spec = compressor_spec::parse(C::name);
    INFO(spec.str());
    CHECK(compressor_spec::parse(spec.str()).str() == spec.str());
    for (int ranks : {2, 3, 4}) {
      INFO(ranks << " ranks");
      local_group::run(ranks, [&](local_group::communicator& comm) {
        bucket_layout const layout = odd_layout(30);  // room for the defaults (GlobalRandK: 10000 coordinates)
        std::size_t const d = layout.size();
        any_allreducer<local_group::communicator, host_space> chosen(spec, comm, layout, host_space{});
        visit_compressor(spec, ranks, [&](auto c, auto ef) {
          using typed_t = host_reducer<decltype(c), decltype(ef), local_group::communicator>;
          CHECK(std::string(decltype(c)::name) == std::string(C::name));
          CHECK(decltype(ef)::enabled == spec.uses_error_feedback());
          typed_t typed(c, comm, layout, host_space{});
          CHECK(chosen.fingerprint() == typed.fingerprint());
          for (int step = 0; step < 2; ++step) {
            auto a = random_gradient(70 + step, comm.rank(), d), b = a;
            chosen({a.data(), d});
            typed({b.data(), d});
            CHECK(std::memcmp(a.data(), b.data(), d * sizeof(float)) == 0);
          }
          return 0;
        });
      });
    }
  });
}

TEST_CASE("each compressor has one name: its spec, its folder, its type's name") {
  std::set<std::string> const names = registered_names();
  int entries = 0;
  for_each_registered([&]<class C>(std::type_identity<C>) { ++entries; });
  CHECK(names.size() == static_cast<std::size_t>(entries));  // no name twice
  auto const folders = source_dir() / "include" / "gradcomp" / "compressors";
  for (auto const& name : names) {
    INFO(name);
    bool const baseline = name == "fp32" || name == "fp16" || name == "bf16";  // the casts share cast/
    auto const folder = folders / (baseline ? std::string("cast") : name);
    CHECK(std::filesystem::is_directory(folder));
    CHECK(std::filesystem::exists(folder / ((baseline ? std::string("cast") : name) + ".hpp")));
    CHECK(compressor_spec::is_known(name));
  }
  for (auto const& entry : std::filesystem::directory_iterator(folders)) {  // and no folder without a compressor
    std::string const folder = entry.path().filename().string();
    if (!entry.is_directory() || folder == "detail") continue;
    INFO(folder);
    CHECK((names.count(folder) == 1 || folder == "cast"));
  }
}

TEST_CASE("a compressor's spec keys are keys a spec holds, and the spec takes exactly them") {
  std::string const all = ", " + compressor_spec::keys() + ",";
  for_each_registered([&]<class C>(std::type_identity<C>) {
    std::istringstream words{std::string(C::spec_keys)};
    std::set<std::string> own;
    for (std::string key; words >> key;) {
      INFO(C::name << " declares " << key);
      CHECK(all.find(", " + key + ",") != std::string::npos);
      own.insert(key);
    }
    compressor_spec{}.for_each_key([&](char const* key, auto const&) {
      INFO(C::name << " and " << key);
      CHECK(compressor_spec::takes(C::name, key) == (own.count(key) == 1));
    });
    CHECK(compressor_spec::takes(C::name, "ef"));
  });
}

TEST_CASE("the benchmark rows cover every registered compressor, each named by its spec as written") {
  std::set<std::string> benched;
  std::vector<std::string> rows = bench::flat_row_specs();
  rows.insert(rows.end(), std::begin(bench::transformer_rows), std::end(bench::transformer_rows));
  for (std::string const& text : rows) {
    compressor_spec const spec = compressor_spec::parse(text);
    INFO(text);
    CHECK(spec.str() == text);  // the row's name is the spec that builds it
    benched.insert(spec.name);
  }
  CHECK(benched == registered_names());
}

TEST_CASE("the README's compressor table lists exactly the registered compressors") {
  std::ifstream readme(source_dir() / "README.md");
  REQUIRE(readme.good());
  std::set<std::string> listed;
  bool in_table = false;
  for (std::string line; std::getline(readme, line);) {
    if (line.rfind("## ", 0) == 0) in_table = line == "## Compressors";
    if (!in_table || line.rfind("| `", 0) != 0) continue;
    std::string const spec = line.substr(3, line.find('`', 3) - 3);
    listed.insert(spec.substr(0, spec.find(':')));
  }
  CHECK(listed == registered_names());
}
