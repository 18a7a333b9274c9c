// ParseRequest and DescribeParseFailure: what a handler tells a client whose bytes are not the
// request message. Protobuf's own parser is the reference for which bytes are valid.

#include "rpc/parse.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "absl/strings/escaping.h"
#include "kvstrata/v1/generate.pb.h"
#include "kvstrata/v1/kvstore.pb.h"

namespace kvstrata::rpc {
namespace {

using ::testing::HasSubstr;

std::string Describe(const std::string& bytes) {
  return DescribeParseFailure(bytes, *v1::GenerateRequest::descriptor());
}

v1::GenerateRequest AChat() {
  v1::GenerateRequest r;
  r.set_request_id("req-1");
  v1::ChatMessage* m = r.mutable_chat()->add_messages();
  m->set_role("system");
  m->set_content("You are helpful.");
  m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Hi");
  r.mutable_stop()->add_stop_strings("END");
  r.mutable_sampling()->set_temperature(0.5f);
  return r;
}

TEST(ParseRequestTest, AValidMessageParsesAndHasNoProblem) {
  const v1::GenerateRequest r = AChat();
  const std::string bytes = r.SerializeAsString();
  v1::GenerateRequest parsed;
  ASSERT_TRUE(ParseRequest(bytes, &parsed).ok());
  EXPECT_EQ(parsed.chat().messages(1).content(), "Hi");
  EXPECT_EQ(Describe(bytes), "");
  EXPECT_EQ(Describe(""), "");
}

TEST(ParseRequestTest, InvalidUtf8IsNamedByItsFieldPath) {
  v1::GenerateRequest r = AChat();
  std::string bytes = r.SerializeAsString();
  // Corrupt the second message's content "Hi" in place.
  const size_t at = bytes.find("Hi");
  ASSERT_NE(at, std::string::npos);
  bytes[at] = '\xc3';
  bytes[at + 1] = '\x28';
  v1::GenerateRequest parsed;
  const absl::Status s = ParseRequest(bytes, &parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("kvstrata.v1.GenerateRequest"));
  EXPECT_THAT(s.message(), HasSubstr("chat.messages[1].content"));
  EXPECT_THAT(s.message(), HasSubstr("invalid UTF-8"));

  v1::GenerateRequest stop = AChat();
  stop.mutable_stop()->add_stop_strings("fine");
  stop.mutable_stop()->add_stop_strings(std::string("\xff", 1));
  // The generated serialiser checks UTF-8 only in debug builds; the bytes go out either way.
  EXPECT_THAT(Describe(stop.SerializeAsString()), HasSubstr("stop.stop_strings[2]"));
}

TEST(ParseRequestTest, BrokenWireFormatSaysWhereItBreaks) {
  EXPECT_THAT(Describe(std::string("\x1a\x05\x61\x62", 4)), HasSubstr("text (byte 0): length 5"));
  EXPECT_THAT(Describe(std::string("\x48\xff\xff", 3)), HasSubstr("priority (byte 0): truncated"));
  EXPECT_THAT(Describe(std::string("\x0f", 1)), HasSubstr("invalid wire type 7"));
  EXPECT_THAT(Describe(std::string("\x0c", 1)), HasSubstr("end-group tag"));
  EXPECT_THAT(Describe(std::string("\x00", 1)), HasSubstr("invalid field tag"));
  // A tag longer than 5 bytes (the stream's ReadTag would take it, dropping the high bits).
  EXPECT_THAT(Describe(std::string("\x10\x10\xf0\xe7\xef\xef\xf0\x10", 8)),
              HasSubstr("byte 2: invalid field tag"));
  // A length longer than 5 bytes, even one whose value is 0 (the stream's ReadVarint32 takes
  // up to 10), and a 5-byte length of 2 GiB or more.
  const std::string overlong("\x2a\x80\x80\x80\x80\x80\x80\x00", 8);
  EXPECT_FALSE(v1::GenerateRequest().ParseFromString(overlong));
  EXPECT_THAT(Describe(overlong), HasSubstr("overlong"));
  const std::string huge("\x1a\x80\x80\x80\x80\x08", 6);
  EXPECT_FALSE(v1::GenerateRequest().ParseFromString(huge));
  EXPECT_THAT(Describe(huge), HasSubstr("text (byte 0)"));
  // token_ids (4) { ids (1), packed: a truncated varint }
  EXPECT_THAT(Describe(std::string("\x22\x03\x0a\x01\xff", 5)), HasSubstr("token_ids.ids"));
}

TEST(ParseRequestTest, NestingBeyondTheParsersLimitIsAProblem) {
  // 101 nested chats are impossible (chat is not recursive); use unknown groups instead: the
  // parser refuses groups nested past its recursion limit.
  std::string deep;
  for (int i = 0; i < 120; ++i) deep += '\x7b';  // field 15, start group
  for (int i = 0; i < 120; ++i) deep += '\x7c';  // field 15, end group
  v1::GenerateRequest parsed;
  EXPECT_FALSE(parsed.ParseFromString(deep));
  EXPECT_THAT(Describe(deep), HasSubstr("too deep"));
}

// The reference: whatever the bytes, the description is empty exactly when protobuf parses them.
TEST(ParseRequestTest, AgreesWithTheParserOnMutatedMessages) {
  google::protobuf::LogSilencer quiet;  // the parser logs each string that is not UTF-8
  std::mt19937 rng(7);
  const std::string base = AChat().SerializeAsString();
  v1::PutRequest put;
  put.mutable_header()->set_key(std::string(16, 'k'));
  put.mutable_header()->set_byte_length(128);
  const std::string put_base = put.SerializeAsString();
  int failures = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = (i % 2 == 0) ? base : put_base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !bytes.empty(); ++e) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes.erase(at, 1 + rng() % 3);
          break;
        case 2:
          bytes.insert(at, 1, static_cast<char>(rng()));
          break;
      }
    }
    if (i % 2 == 0) {
      v1::GenerateRequest m;
      const bool parses = m.ParseFromString(bytes);
      failures += !parses;
      ASSERT_EQ(Describe(bytes).empty(), parses) << i << ": " << Describe(bytes) << " bytes " << absl::BytesToHexString(bytes);
    } else {
      v1::PutRequest m;
      const bool parses = m.ParseFromString(bytes);
      failures += !parses;
      ASSERT_EQ(DescribeParseFailure(bytes, *v1::PutRequest::descriptor()).empty(), parses) << i;
    }
  }
  EXPECT_GT(failures, 1000);  // the mutations do break messages
}

}  // namespace
}  // namespace kvstrata::rpc
