// The compressor registry is the one list of compressors, and everything
// that must cover every compressor covers exactly that list: each registered
// compressor builds from its spec on 2, 3 and 4 ranks and steps bitwise as
// its typed allreducer, its spec reads back what it writes, its name is its
// folder's, the keys its spec takes are the parameters it declares (each
// reaching the compressor), and the benchmark rows and the README's
// compressor table hold every one of them, the table with their keys.
#include "../bench/common/rows.hpp"
#include "common/compressors.hpp"
#include "common/harness.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
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

namespace {

// A value of T other than `v` (what a spec sets must reach the compressor).
template <class T>
T another(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return v == 0 ? T(0.25) : v / 2;
  else
    return static_cast<T>(v + 1);
}

// Compressor X's parameter `key`, as a spec writes it.
template <class X>
std::string parameter_text(X const& x, std::string_view key) {
  std::string out;
  for_each_parameter<X>([&](auto const& p) {
    if (p.key == key) out = gradcomp::detail::write_value(x.*p.member);
  });
  return out;
}

}  // namespace

TEST_CASE("a compressor's declared parameters are the keys its spec takes, and each reaches the compressor") {
  auto const all = compressor_spec::keys();
  for_each_registered([&]<class C>(std::type_identity<C>) {
    std::set<std::string> own;
    for_each_parameter<C>([&](auto const& p) {
      INFO(C::name << " declares " << p.key);
      CHECK(own.insert(std::string(p.key)).second);  // once
      CHECK(!p.meaning.empty());
      CHECK(!p.range.empty());
    });
    if (C::integer_lane) own.insert("lane");
    for (std::string const& key : all) {
      INFO(C::name << " and " << key);
      CHECK(compressor_spec::takes(C::name, key) == (own.count(key) == 1 || key == "ef"));
    }
    // Each declared parameter a spec sets is the built compressor's, in every lane
    // it picks (a from_spec that skipped one would leave the default).
    for_each_parameter<C>([&](auto const& p) {
      using T = typename std::remove_cvref_t<decltype(p)>::value_type;
      std::string const value = gradcomp::detail::write_value(another<T>(C{}.*p.member));
      compressor_spec spec = compressor_spec::parse(C::name);
      spec.set(std::string(p.key), value);
      INFO(spec.str());
      CHECK(spec.value_of(p.key) == value);
      for (int ranks : {2, 64})
        visit_compressor(spec, ranks, [&](auto c, auto) {
          CHECK(parameter_text(c, p.key) == value);
          return 0;
        });
    });
  });
}

// Values outside each key's range, whatever the compressor: a key declared
// without an entry here fails the test, so a new parameter needs its own.
std::map<std::string, std::vector<std::string>> const out_of_range = {
    {"fraction", {"0", "2", "-0.5"}}, {"chunk_size", {"0", "3"}}, {"bits", {"0", "99"}},
    {"block", {"3", "8192"}},         {"stages", {"-2", "99"}},   {"k", {"0"}},
    {"matrix_rank", {"0"}},
};

TEST_CASE("a spec with a value out of its key's range is refused when read, naming the key, whatever the ranks") {
  for_each_registered([&]<class C>(std::type_identity<C>) {
    for_each_parameter<C>([&](auto const& p) {
      std::string const key(p.key);
      INFO(C::name << " " << key);
      REQUIRE(out_of_range.count(key) == 1);
      for (std::string const& bad : out_of_range.at(key)) {
        std::string const text = std::string(C::name) + ":" + key + "=" + bad;
        INFO(text);
        std::string const message = error_of(text);
        // The compressor's own message, naming the key and the value it refuses.
        CHECK(message.rfind(std::string(C::name) + ": " + key + "=" + bad, 0) == 0);
        // The same refusal for any group: validate(ranks) is what a hook runs at registration.
        compressor_spec spec = compressor_spec::parse(C::name);
        spec.set(key, bad);
        for (int ranks : {1, 2, 64}) {
          std::string got;
          try {
            spec.validate(ranks);
          } catch (invalid_argument const& e) {
            got = e.what();
          }
          CHECK(got == message);
        }
      }
    });
  });
  // A group too large for the lane asked for is refused by validate(ranks), not by parse.
  compressor_spec const narrow = compressor_spec::parse("thc:bits=7,lane=int8");
  CHECK_NOTHROW(narrow.validate(2));
  CHECK_THROWS_WITH_AS(narrow.validate(4), doctest::Contains("4 ranks x levels 0..127 (bits=7)"), invalid_argument);
}

TEST_CASE("a spec's items are key=value, with nothing empty between or after them") {
  for (char const* text : {"bf16:", "topkc:fraction=0.25,", "topkc:,fraction=0.25", "thc:bits=4,,block=64", "thc:=4"})
    CHECK_THROWS_WITH_AS(compressor_spec::parse(text), doctest::Contains("is not key=value"), invalid_argument);
  CHECK(compressor_spec::parse("topkc:fraction=0.25").str() == "topkc:fraction=0.25");
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

TEST_CASE("the README's compressor table lists exactly the registered compressors, each with the keys it takes") {
  std::ifstream readme(source_dir() / "README.md");
  REQUIRE(readme.good());
  std::set<std::string> listed;
  bool in_table = false;
  for (std::string line; std::getline(readme, line);) {
    if (line.rfind("## ", 0) == 0) in_table = line == "## Compressors";
    if (!in_table || line.rfind("| `", 0) != 0) continue;
    std::string const spec = line.substr(3, line.find('`', 3) - 3);
    std::string const name = spec.substr(0, spec.find(':'));
    listed.insert(name);
    std::set<std::string> keys;  // the row's keys: the compressor's own, as it declares them
    if (spec.find(':') != std::string::npos) {
      std::istringstream items(spec.substr(spec.find(':') + 1));
      for (std::string item; std::getline(items, item, ',');) keys.insert(item.substr(0, item.find('=')));
    }
    for (std::string const& key : compressor_spec::keys()) {
      INFO(name << " and " << key);
      if (key != "ef") CHECK(compressor_spec::takes(name, key) == (keys.count(key) == 1));
    }
  }
  CHECK(listed == registered_names());
}
