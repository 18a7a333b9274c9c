#pragma once

// The check every component's metrics get: each metric it declares is on its /metrics endpoint
// (HELP and TYPE lines, served by MetricsServer on loopback), the endpoint passes
// `promtool check metrics`, and the component's doc names each metric (as `name` or
// `name{labels}`, or by its short name where the doc's table leaves out a common prefix).
// Header-only; needs promtool.

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "core/metrics.h"
#include "tests/testing/loopback.h"

namespace kvstrata::test_util {

// doc: a path relative to the source folder (tests run there); prefix: what the doc's table
// leaves out of each name ("" if nothing).
inline void ExpectDeclaredMetricsServedAndDocumented(const MetricsRegistry& registry,
                                                     const std::string& doc,
                                                     const std::string& prefix = "") {
  ASSERT_FALSE(registry.names().empty());
  std::string error;
  std::unique_ptr<MetricsServer> server = MetricsServer::Start(&registry, "127.0.0.1:0", &error);
  ASSERT_NE(server, nullptr) << error;
  const std::string body = HttpGet(server->port(), "/metrics");
  std::ifstream doc_file(doc);
  ASSERT_TRUE(doc_file.good()) << "cannot read " << doc;
  const std::string doc_text((std::istreambuf_iterator<char>(doc_file)),
                             std::istreambuf_iterator<char>());
  for (const std::string& name : registry.names()) {
    EXPECT_NE(body.find("\n# TYPE " + name + " "), std::string::npos)
        << name << " is declared but not on /metrics:\n"
        << body;
    const bool has_prefix = !prefix.empty() && name.rfind(prefix, 0) == 0;
    const std::string short_name = has_prefix ? name.substr(prefix.size()) : name;
    bool listed = false;
    for (const std::string& n : {name, short_name}) {
      listed = listed || doc_text.find("`" + n + "`") != std::string::npos ||
               doc_text.find("`" + n + "{") != std::string::npos;
    }
    EXPECT_TRUE(listed) << name << " is declared but " << doc << " does not list it";
  }
  const std::string path = ::testing::TempDir() + "/declared_metrics.txt";
  std::ofstream(path) << body;
  const int rc =
      std::system(("promtool check metrics < " + path + " > " + path + ".out 2>&1").c_str());
  std::ifstream out(path + ".out");
  const std::string lint((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << lint;
}

}  // namespace kvstrata::test_util
