#include "rpc/server.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "rpc/status.h"

namespace kvstrata::rpc {
namespace {

using ::google::protobuf::UnknownField;
using ::google::protobuf::UnknownFieldSet;
using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::Contains;
using ::testing::HasSubstr;

// Answers Stats only; the other KvStore RPCs keep the generated UNIMPLEMENTED answer.
class StatsOnlyKvStore final : public v1::KvStore::Service {
 public:
  grpc::Status Stats(grpc::ServerContext* /*context*/, const v1::StatsRequest* /*request*/,
                     v1::StatsResponse* response) override {
    response->set_store_id("stats-only");
    response->set_pages(7);
    response->set_bytes_capacity(uint64_t{1} << 30);
    response->set_tier(v1::STORAGE_TIER_HOST);
    return grpc::Status::OK;
  }
};

void SetTestDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Server>> server =
        Server::Start({.listen_address = "127.0.0.1:0", .services = {&store_}});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  }

  grpc::Status CheckHealth(const std::string& service, HealthCheckResponse* response) {
    grpc::ClientContext context;
    SetTestDeadline(context);
    HealthCheckRequest request;
    request.set_service(service);
    return Health::NewStub(channel_)->Check(&context, request, response);
  }

  StatsOnlyKvStore store_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ServerTest, ReportsTheEphemeralPortItBound) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), absl::StrCat("127.0.0.1:", server_->port()));
}

TEST_F(ServerTest, HealthCheckOfWholeServerIsServing) {
  HealthCheckResponse response;
  grpc::Status status = CheckHealth("", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
}

TEST_F(ServerTest, HealthFollowsSetServingStatus) {
  HealthCheckResponse response;
  EXPECT_EQ(CheckHealth("kvstrata.v1.KvStore", &response).error_code(),
            grpc::StatusCode::NOT_FOUND);

  server_->SetServingStatus("kvstrata.v1.KvStore", false);
  ASSERT_TRUE(CheckHealth("kvstrata.v1.KvStore", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);

  server_->SetServingStatus("kvstrata.v1.KvStore", true);
  ASSERT_TRUE(CheckHealth("kvstrata.v1.KvStore", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
}

TEST_F(ServerTest, StatsAnswersAndOtherRpcsAreUnimplemented) {
  std::unique_ptr<v1::KvStore::Stub> stub = v1::KvStore::NewStub(channel_);
  {
    grpc::ClientContext context;
    SetTestDeadline(context);
    v1::StatsResponse response;
    grpc::Status status = stub->Stats(&context, v1::StatsRequest(), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.store_id(), "stats-only");
    EXPECT_EQ(response.pages(), 7u);
    EXPECT_EQ(response.bytes_capacity(), uint64_t{1} << 30);
    EXPECT_EQ(response.tier(), v1::STORAGE_TIER_HOST);
  }
  {
    grpc::ClientContext context;
    SetTestDeadline(context);
    v1::LookupResponse response;
    absl::Status status = FromGrpcStatus(stub->Lookup(&context, v1::LookupRequest(), &response));
    EXPECT_TRUE(absl::IsUnimplemented(status)) << status;
  }
}

TEST_F(ServerTest, ShutdownStopsServing) {
  server_->Shutdown(absl::ZeroDuration());
  server_->Wait();
  HealthCheckResponse response;
  EXPECT_FALSE(CheckHealth("", &response).ok());
}

// Debian ships no C++ client for server reflection, so the test speaks its wire format:
// grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo, a bidi stream of
// ServerReflectionRequest / ServerReflectionResponse, field numbers from the public spec.
constexpr char kReflectionMethod[] =
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
constexpr int kRequestFileContainingSymbol = 4;
constexpr int kRequestListServices = 7;
constexpr int kResponseFileDescriptor = 4;
constexpr int kResponseListServices = 6;
constexpr int kResponseError = 7;

// Sends one reflection request and returns the one response, as raw fields.
absl::StatusOr<std::unique_ptr<UnknownFieldSet>> AskReflection(
    const std::shared_ptr<grpc::Channel>& channel, int request_field, const std::string& value) {
  UnknownFieldSet request;
  request.AddLengthDelimited(request_field, value);
  std::string request_bytes;
  request.SerializeToString(&request_bytes);

  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  SetTestDeadline(context);
  grpc::CompletionQueue queue;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, kReflectionMethod, &queue);

  // Runs one asynchronous step to completion; steps are issued one at a time.
  auto await = [&queue](intptr_t expected) {
    void* tag = nullptr;
    bool ok = false;
    return queue.Next(&tag, &ok) && tag == reinterpret_cast<void*>(expected) && ok;
  };
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::Status status;
  call->StartCall(reinterpret_cast<void*>(1));
  bool ok = await(1);
  if (ok) {
    call->Write(request_buffer, reinterpret_cast<void*>(2));
    ok = await(2);
  }
  if (ok) {
    call->Read(&response_buffer, reinterpret_cast<void*>(3));
    ok = await(3);
  }
  if (ok) {
    call->WritesDone(reinterpret_cast<void*>(4));
    ok = await(4);
  }
  call->Finish(&status, reinterpret_cast<void*>(5));
  const bool finished = await(5);
  queue.Shutdown();
  void* tag;
  bool drained_ok;
  while (queue.Next(&tag, &drained_ok)) {
  }
  if (!finished || !status.ok()) {
    return absl::InternalError(absl::StrCat("reflection call failed: ", status.error_message()));
  }
  if (!ok) return absl::InternalError("reflection call ended without a response");

  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) return absl::InternalError("cannot read response");
  std::string response_bytes;
  for (const grpc::Slice& s : slices) {
    response_bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  auto response = std::make_unique<UnknownFieldSet>();
  if (!response->ParseFromString(response_bytes)) {
    return absl::InternalError("unparsable reflection response");
  }
  return response;
}

// Values of every length-delimited field `number` in `fields`.
std::vector<std::string> StringFields(const UnknownFieldSet& fields, int number) {
  std::vector<std::string> values;
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& field = fields.field(i);
    if (field.number() == number && field.type() == UnknownField::TYPE_LENGTH_DELIMITED) {
      values.push_back(field.length_delimited());
    }
  }
  return values;
}

TEST_F(ServerTest, ReflectionListsKvStore) {
  absl::StatusOr<std::unique_ptr<UnknownFieldSet>> response =
      AskReflection(channel_, kRequestListServices, "*");
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_TRUE(StringFields(**response, kResponseError).empty());
  std::vector<std::string> lists = StringFields(**response, kResponseListServices);
  ASSERT_EQ(lists.size(), 1u);

  // ListServiceResponse { repeated ServiceResponse service = 1; } ServiceResponse { name = 1; }
  UnknownFieldSet list;
  ASSERT_TRUE(list.ParseFromString(lists[0]));
  std::vector<std::string> names;
  for (const std::string& service_bytes : StringFields(list, 1)) {
    UnknownFieldSet service;
    ASSERT_TRUE(service.ParseFromString(service_bytes));
    for (const std::string& name : StringFields(service, 1)) names.push_back(name);
  }
  EXPECT_THAT(names, Contains("kvstrata.v1.KvStore"));
}

TEST_F(ServerTest, ReflectionServesTheKvStoreDescriptor) {
  absl::StatusOr<std::unique_ptr<UnknownFieldSet>> response =
      AskReflection(channel_, kRequestFileContainingSymbol, "kvstrata.v1.KvStore");
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_TRUE(StringFields(**response, kResponseError).empty());
  std::vector<std::string> descriptors = StringFields(**response, kResponseFileDescriptor);
  ASSERT_EQ(descriptors.size(), 1u);

  // FileDescriptorResponse { repeated bytes file_descriptor_proto = 1; }: the file and its
  // imports, so a tool like grpcurl can build requests without the .proto files.
  UnknownFieldSet files;
  ASSERT_TRUE(files.ParseFromString(descriptors[0]));
  std::vector<std::string> file_names;
  std::vector<std::string> kvstore_methods;
  for (const std::string& file_bytes : StringFields(files, 1)) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(file_bytes));
    file_names.push_back(file.name());
    for (const auto& service : file.service()) {
      if (service.name() != "KvStore") continue;
      for (const auto& method : service.method()) kvstore_methods.push_back(method.name());
    }
  }
  EXPECT_THAT(file_names, Contains("kvstrata/v1/kvstore.proto"));
  EXPECT_THAT(file_names, Contains("kvstrata/v1/common.proto"));
  EXPECT_THAT(kvstore_methods, Contains("Stats"));
  EXPECT_THAT(kvstore_methods, Contains("OpenTransfer"));
}

TEST_F(ServerTest, OccupiedAddressIsAnErrorNamingIt) {
  StatsOnlyKvStore other;
  absl::StatusOr<std::unique_ptr<Server>> second =
      Server::Start({.listen_address = server_->address(), .services = {&other}});
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(server_->address()));
}

TEST(ServerStartTest, InvalidAddressesAreErrorsNamingThem) {
  // gRPC alone would start, on some other port.
  absl::StatusOr<std::unique_ptr<Server>> out_of_range =
      Server::Start({.listen_address = "127.0.0.1:99999"});
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(out_of_range.status())) << out_of_range.status();
  EXPECT_THAT(out_of_range.status().message(), HasSubstr("127.0.0.1:99999"));

  const std::string no_such_dir = "unix:/nonexistent-kvstrata-dir/server.sock";
  absl::StatusOr<std::unique_ptr<Server>> unbindable =
      Server::Start({.listen_address = no_such_dir});
  ASSERT_FALSE(unbindable.ok());
  EXPECT_TRUE(absl::IsUnavailable(unbindable.status())) << unbindable.status();
  EXPECT_THAT(unbindable.status().message(), HasSubstr(no_such_dir));

  absl::StatusOr<std::unique_ptr<Server>> empty = Server::Start({.listen_address = ""});
  EXPECT_TRUE(absl::IsInvalidArgument(empty.status())) << empty.status();
}

TEST(StatusTest, EveryCodeRoundTrips) {
  for (int code = 0; code <= 16; ++code) {
    SCOPED_TRACE(code);
    const absl::Status original(static_cast<absl::StatusCode>(code), "page 3 of request r1");
    const grpc::Status converted = ToGrpcStatus(original);
    EXPECT_EQ(static_cast<int>(converted.error_code()), code);
    if (code != 0) {
      EXPECT_EQ(converted.error_message(), "page 3 of request r1");
    }
    EXPECT_EQ(FromGrpcStatus(converted), original);

    const grpc::Status wire(static_cast<grpc::StatusCode>(code), "from the wire");
    const absl::Status back = FromGrpcStatus(wire);
    EXPECT_EQ(static_cast<int>(back.code()), code);
    const grpc::Status again = ToGrpcStatus(back);
    EXPECT_EQ(again.error_code(), wire.error_code());
    if (code != 0) {
      EXPECT_EQ(again.error_message(), "from the wire");
    }
  }
}

// 20 is no code of either enum, yet a value each can hold (their range is 0..31): an enum
// variable holding 42 would itself be undefined behaviour.
TEST(StatusTest, CodesOutsideTheEnumBecomeUnknownKeepingTheMessage) {
  const absl::Status from_wire =
      FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd peer"));
  EXPECT_EQ(from_wire, absl::UnknownError("odd peer"));
  const grpc::Status to_wire =
      ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(20), "odd library"));
  EXPECT_EQ(to_wire.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(to_wire.error_message(), "odd library");
}

// The health-only port answers in plaintext what the main port answers, and serves nothing
// else: Kubernetes probes it while the main port speaks only TLS.
TEST(ServerHealthPortTest, MirrorsTheServingStatusAndServesNothingElse) {
  StatsOnlyKvStore store;
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Start({.listen_address = "127.0.0.1:0",
                     .services = {&store},
                     .health_listen_address = "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->health_port(), 0);
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->health_port()),
                                     grpc::InsecureChannelCredentials());
  auto check = [&](const std::string& service) {
    grpc::ClientContext context;
    SetTestDeadline(context);
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    const grpc::Status status = Health::NewStub(channel)->Check(&context, request, &response);
    return status.ok() ? response.status() : HealthCheckResponse::UNKNOWN;
  };
  EXPECT_EQ(check(""), HealthCheckResponse::SERVING);
  (*server)->SetServingStatus("kvstrata.v1.KvStore", true);
  EXPECT_EQ(check("kvstrata.v1.KvStore"), HealthCheckResponse::SERVING);
  (*server)->SetServingStatus("kvstrata.v1.KvStore", false);
  EXPECT_EQ(check("kvstrata.v1.KvStore"), HealthCheckResponse::NOT_SERVING);

  grpc::ClientContext context;
  SetTestDeadline(context);
  v1::StatsResponse stats;
  EXPECT_EQ(v1::KvStore::NewStub(channel)->Stats(&context, v1::StatsRequest(), &stats).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

}  // namespace
}  // namespace kvstrata::rpc
