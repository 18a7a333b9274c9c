// TLS, mTLS and roles on a real kvstore service, with certificates made by openssl for this test
// (tests/testing/make_test_certs.sh): which handshakes succeed, who may Put, that renewed
// certificate files are picked up, and that a forged page is never handed to a worker.

#include <gmock/gmock.h>
#include <grpc/grpc_security_constants.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/metrics.h"
#include "core/page_mac.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "rpc/peer_auth.h"
#include "rpc/server.h"
#include "rpc/tls.h"
#include "services/kvstore/client.h"
#include "services/kvstore/kvstore_service.h"
#include "tests/services/test_pages.h"

namespace kvstrata::kvstore {
namespace {

using ::kvstrata::kvstore::testing::Key;
using ::kvstrata::kvstore::testing::MakeChain;
using ::kvstrata::kvstore::testing::TestPage;
using ::testing::HasSubstr;

const char kPoolKey[] = "6b76737472617461207465737420706f6f6c206b657920666f72207061676573";
const char kOtherKey[] = "0000000000000000000000000000000000000000000000000000000000000001";

// One certificate folder for the whole binary: openssl runs once.
const std::string& CertDir() {
  static const std::string dir = [] {
    const std::string d = absl::StrCat(::testing::TempDir(), "/kvstrata-certs-", getpid());
    const std::string command =
        absl::StrCat("tests/testing/make_test_certs.sh '", d, "' >/dev/null 2>&1");
    if (std::system(command.c_str()) != 0) {
      ADD_FAILURE() << "openssl failed: " << command << " (is the openssl CLI installed?)";
    }
    return d;
  }();
  return dir;
}

std::string Cert(const std::string& name) { return absl::StrCat(CertDir(), "/", name); }

rpc::TransportSecurity Security(const std::string& name, const std::string& ca = "ca",
                                absl::Duration reload = absl::Seconds(10)) {
  absl::StatusOr<rpc::TransportSecurity> s =
      rpc::TransportSecurity::Tls({.cert_file = name.empty() ? "" : Cert(name + ".pem"),
                                   .key_file = name.empty() ? "" : Cert(name + ".key"),
                                   .ca_file = Cert(ca + ".pem"),
                                   .reload_interval = reload});
  KV_CHECK(s.ok()) << s.status();
  return *std::move(s);
}

std::vector<PutPage> ToPut(const std::vector<TestPage>& pages) {
  std::vector<PutPage> out;
  for (const TestPage& p : pages) {
    out.push_back({.key = p.meta.key,
                   .parent_key = p.meta.parent_key,
                   .page_index = p.meta.page_index,
                   .encoding = ToProto(p.meta.form),
                   .bytes = std::string(p.bytes.begin(), p.bytes.end())});
  }
  return out;
}

std::shared_ptr<const PageMacKeys> MacKeys(const char* hex) {
  absl::StatusOr<std::shared_ptr<const PageMacKeys>> keys = PageMacKeys::FromHex({hex});
  KV_CHECK(keys.ok()) << keys.status();
  return *keys;
}

// A kvstore with mTLS (client certificates required) and the worker role enforced.
class SecureKvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(Security("kvstore")); }

  void Start(const rpc::TransportSecurity& security) {
    PageStoreOptions options;
    options.capacity_bytes = 64 * 16448;
    store_ = std::make_unique<PageStore>(options, &clock_);
    authorizer_ = std::make_unique<rpc::PeerAuthorizer>(rpc::PeerPolicy{.enforce = true},
                                                        &registry_, "kvstore");
    service_ = std::make_unique<KvStoreService>(
        store_.get(), KvStoreServiceOptions{.store_id = "secure", .authorizer = authorizer_.get()},
        &registry_);
    absl::StatusOr<std::unique_ptr<rpc::Server>> server =
        rpc::Server::Start({.listen_address = "127.0.0.1:0",
                            .services = {service_.get()},
                            .credentials = security.ServerCredentials(rpc::ClientCerts::kRequire)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A client as `cert` (empty: none), trusting `ca`, with its own connection.
  KvStoreClient Client(const std::string& cert, const std::string& ca = "ca",
                       std::shared_ptr<const PageMacKeys> mac = nullptr) {
    const rpc::TransportSecurity security = Security(cert, ca);
    return KvStoreClient(server_->address(),
                         {.lookup_deadline = absl::Seconds(5),
                          .put_deadline = absl::Seconds(5),
                          .fetch_deadline = absl::Seconds(5),
                          .dial =
                              [security](const std::string& address) {
                                grpc::ChannelArguments args = security.ChannelArgs();
                                args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
                                return grpc::CreateCustomChannel(
                                    address, security.ChannelCredentials(), args);
                              },
                          .page_mac_keys = std::move(mac)});
  }

  // Stats through `client`'s kind of channel: any peer with a certificate from the CA may ask.
  absl::Status Handshake(const std::string& cert, const std::string& ca = "ca") {
    KvStoreClient client = Client(cert, ca);
    return client.Lookup(std::vector<PageKey>{Key(1)}).status();
  }

  double DeniedCount(const std::string& rpc, const std::string& code) {
    const std::string text = registry_.Render();
    const std::string needle =
        absl::StrCat("kvstrata_kvstore_auth_denied_total{code=\"", code, "\",rpc=\"", rpc, "\"} ");
    const size_t at = text.find(needle);
    return at == std::string::npos ? 0 : std::stod(text.substr(at + needle.size()));
  }

  SystemClock clock_;
  MetricsRegistry registry_;
  std::unique_ptr<PageStore> store_;
  std::unique_ptr<rpc::PeerAuthorizer> authorizer_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<rpc::Server> server_;
};

TEST(TransportSecurityTest, RefusesBadFilesAtStartUp) {
  auto tls = [](std::string cert, std::string key, std::string ca) {
    return rpc::TransportSecurity::Tls({.cert_file = cert, .key_file = key, .ca_file = ca})
        .status();
  };
  EXPECT_TRUE(tls(Cert("worker.pem"), Cert("worker.key"), Cert("ca.pem")).ok());
  const absl::Status missing = tls(Cert("nope.pem"), Cert("worker.key"), Cert("ca.pem"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("nope.pem"));
  const absl::Status mismatch = tls(Cert("worker.pem"), Cert("router.key"), Cert("ca.pem"));
  EXPECT_THAT(mismatch.message(), HasSubstr("does not belong to the certificate"));
  const absl::Status expired = tls(Cert("expired.pem"), Cert("expired.key"), Cert("ca.pem"));
  EXPECT_THAT(expired.message(), HasSubstr("expired"));
  const absl::Status not_pem = tls(Cert("worker.pem"), Cert("worker.key"), Cert("worker.key"));
  EXPECT_THAT(not_pem.message(), HasSubstr("no PEM certificate"));
  EXPECT_THAT(tls(Cert("worker.pem"), "", Cert("ca.pem")).message(), HasSubstr("--tls_key"));
  EXPECT_THAT(rpc::TransportSecurity::Insecure().Describe(), HasSubstr("plaintext"));
}

TEST_F(SecureKvStoreTest, HandshakesSucceedAndFailAsTheyShould) {
  EXPECT_TRUE(Handshake("worker").ok());
  EXPECT_TRUE(Handshake("router").ok());
  // No client certificate: mTLS refuses the handshake.
  EXPECT_EQ(Handshake("").code(), absl::StatusCode::kUnavailable);
  // A client certificate from a CA the store does not trust.
  EXPECT_EQ(Handshake("rogue").code(), absl::StatusCode::kUnavailable);
  // The client does not trust the store's CA.
  EXPECT_EQ(Handshake("worker", "other-ca").code(), absl::StatusCode::kUnavailable);

  // An expired client certificate: TransportSecurity::Tls refuses it at start-up, so present
  // it through gRPC directly.
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          Cert("expired.key"), Cert("expired.pem"), Cert("ca.pem"), 10));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  auto stub = v1::KvStore::NewStub(
      grpc::CreateChannel(server_->address(), grpc::experimental::TlsCredentials(options)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::StatsResponse stats;
  EXPECT_EQ(stub->Stats(&context, v1::StatsRequest(), &stats).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // The store's certificate does not carry the name the client expects.
  absl::StatusOr<rpc::TransportSecurity> wrong_name =
      rpc::TransportSecurity::Tls({.cert_file = Cert("worker.pem"),
                                   .key_file = Cert("worker.key"),
                                   .ca_file = Cert("ca.pem"),
                                   .server_name = "kvstrata-elsewhere"});
  ASSERT_TRUE(wrong_name.ok());
  auto misnamed = v1::KvStore::NewStub(wrong_name->Dial(server_->address()));
  grpc::ClientContext misnamed_context;
  misnamed_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(misnamed->Stats(&misnamed_context, v1::StatsRequest(), &stats).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // Plaintext to a TLS port fails too.
  auto plain = v1::KvStore::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext plain_context;
  plain_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(plain->Stats(&plain_context, v1::StatsRequest(), &stats).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecureKvStoreTest, OnlyAWorkerCertificateMayPutOrPin) {
  const std::vector<TestPage> chain = MakeChain({1, 2});
  KvStoreClient router = Client("router");
  absl::StatusOr<PutSummary> refused = router.Put(ToPut(chain));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("Put needs the worker role"));
  EXPECT_THAT(refused.status().message(), HasSubstr("kvstrata-router"));
  EXPECT_EQ(DeniedCount("Put", "PERMISSION_DENIED"), 1);
  EXPECT_EQ(store_->Stats().pages, 0u);

  // Pin is the worker's too; Lookup is anyone's with a certificate from the CA.
  auto stub = v1::KvStore::NewStub([&] {
    const rpc::TransportSecurity s = Security("router");
    return s.Dial(server_->address());
  }());
  grpc::ClientContext context;
  v1::PinRequest pin;
  pin.add_page_keys(Key(1).ToBytes());
  pin.set_ttl_ms(1000);
  v1::PinResponse pinned;
  EXPECT_EQ(stub->Pin(&context, pin, &pinned).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(DeniedCount("Pin", "PERMISSION_DENIED"), 1);
  // A Lookup that leases its hits pins them, and Release ends a worker's pin: workers' too.
  absl::StatusOr<LookupReply> leased = router.Lookup(std::vector<PageKey>{Key(1)}, 1000);
  EXPECT_EQ(leased.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(router.Release(7).code(), absl::StatusCode::kPermissionDenied);

  KvStoreClient worker = Client("worker");
  absl::StatusOr<PutSummary> put = worker.Put(ToPut(chain));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->pages_stored, 2u);
  absl::StatusOr<LookupReply> found = router.Lookup(std::vector<PageKey>{Key(1), Key(2)});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->matched_pages, 2u);
}

TEST(PeerAuthorizerTest, NoCertificateIsUnauthenticatedAndPlaintextEnforcesNothing) {
  MetricsRegistry registry;
  const rpc::PeerAuthorizer enforced(rpc::PeerPolicy{.enforce = true}, &registry, "kvstore");
  const grpc::Status anonymous = enforced.RequireNames({}, "Put", rpc::PeerRole::kWorker);
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(anonymous.error_message(), HasSubstr("no verified client certificate"));
  EXPECT_TRUE(enforced.RequireNames({"x", "kvstrata-decode"}, "Put", rpc::PeerRole::kWorker).ok());
  EXPECT_EQ(
      enforced.RequireNames({"kvstrata-decode"}, "Generate", rpc::PeerRole::kRouter).error_code(),
      grpc::StatusCode::PERMISSION_DENIED);
  const rpc::PeerAuthorizer open(rpc::PeerPolicy{.enforce = false}, nullptr, "kvstore");
  EXPECT_TRUE(open.RequireNames({}, "Put", rpc::PeerRole::kWorker).ok());
}

TEST_F(SecureKvStoreTest, AForgedPageIsRefusedOnFetch) {
  const std::vector<TestPage> chain = MakeChain({1, 2, 3});
  // Page 1 published by the pool, page 2 by a worker without the key (no MAC), page 3 by one
  // with another key: all three are stored, only page 1 may be used.
  ASSERT_TRUE(Client("worker", "ca", MacKeys(kPoolKey)).Put(ToPut({chain[0]})).ok());
  ASSERT_TRUE(Client("worker").Put(ToPut({chain[1]})).ok());
  ASSERT_TRUE(Client("worker", "ca", MacKeys(kOtherKey)).Put(ToPut({chain[2]})).ok());
  ASSERT_EQ(store_->Stats().pages, 3u);

  KvStoreClient reader = Client("worker", "ca", MacKeys(kPoolKey));
  using Ref = std::pair<PageKey, v1::PageEncoding>;
  absl::StatusOr<std::vector<FetchedPage>> good =
      reader.Fetch(std::vector<Ref>{{Key(1), v1::PAGE_ENCODING_UNSPECIFIED}});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->at(0).bytes, std::string(chain[0].bytes.begin(), chain[0].bytes.end()));

  absl::StatusOr<std::vector<FetchedPage>> unsigned_page =
      reader.Fetch(std::vector<Ref>{{Key(2), v1::PAGE_ENCODING_UNSPECIFIED}});
  EXPECT_EQ(unsigned_page.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(unsigned_page.status().message(), HasSubstr("no MAC"));
  EXPECT_TRUE(IsStoreMiss(unsigned_page.status()));
  absl::StatusOr<std::vector<FetchedPage>> forged =
      reader.Fetch(std::vector<Ref>{{Key(3), v1::PAGE_ENCODING_UNSPECIFIED}});
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(forged.status().message(), HasSubstr("MAC does not match"));

  // A key file in rotation (new key first, old second) still reads pages of the old key.
  absl::StatusOr<std::shared_ptr<const PageMacKeys>> rotating =
      PageMacKeys::FromHex({kOtherKey, kPoolKey});
  ASSERT_TRUE(rotating.ok());
  EXPECT_TRUE(Client("worker", "ca", *rotating)
                  .Fetch(std::vector<Ref>{{Key(1), v1::PAGE_ENCODING_UNSPECIFIED}})
                  .ok());
}

TEST(PageMacTest, BindsTheKeyAndEveryByte) {
  const std::vector<TestPage> chain = MakeChain({1});
  const std::span<const uint8_t> page(chain[0].bytes);
  std::shared_ptr<const PageMacKeys> keys = MacKeys(kPoolKey);
  const std::string mac = keys->Sign(Key(1), page);
  ASSERT_EQ(mac.size(), kPageMacBytes);
  EXPECT_TRUE(keys->Verify(Key(1), page, mac).ok());
  EXPECT_EQ(keys->Verify(Key(9), page, mac).code(), absl::StatusCode::kDataLoss);
  std::vector<uint8_t> flipped = chain[0].bytes;
  flipped.back() ^= 1;
  EXPECT_EQ(keys->Verify(Key(1), flipped, mac).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(PageMacKeys::FromHex({"abcd"}).ok());  // too short to be a key
}

// A renewed certificate (Kubernetes rewrites the Secret's files) is served to new connections
// without a restart.
TEST(TlsReloadTest, RenewedServerCertificateIsPickedUp) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/kvstrata-reload-", getpid());
  std::filesystem::create_directories(dir);
  auto install = [&](const std::string& name) {
    for (const char* ext : {".pem", ".key"}) {
      const std::string tmp = absl::StrCat(dir, "/server", ext, ".tmp");
      std::filesystem::copy_file(Cert(name + ext), tmp,
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::rename(tmp, absl::StrCat(dir, "/server", ext));
    }
  };
  install("kvstore");
  absl::StatusOr<rpc::TransportSecurity> server_security =
      rpc::TransportSecurity::Tls({.cert_file = dir + "/server.pem",
                                   .key_file = dir + "/server.key",
                                   .ca_file = Cert("ca.pem"),
                                   .reload_interval = absl::Seconds(1)});
  ASSERT_TRUE(server_security.ok()) << server_security.status();
  SystemClock clock;
  PageStore store(PageStoreOptions{}, &clock);
  MetricsRegistry registry;
  KvStoreService service(&store, {}, &registry);
  absl::StatusOr<std::unique_ptr<rpc::Server>> server = rpc::Server::Start(
      {.listen_address = "127.0.0.1:0",
       .services = {&service},
       .credentials = server_security->ServerCredentials(rpc::ClientCerts::kRequire)});
  ASSERT_TRUE(server.ok()) << server.status();

  const rpc::TransportSecurity client = Security("worker");
  // The common name of the certificate the server shows a new connection.
  auto served_name = [&]() -> std::string {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = v1::KvStore::NewStub(
        grpc::CreateCustomChannel((*server)->address(), client.ChannelCredentials(), args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::StatsResponse stats;
    if (!stub->Stats(&context, v1::StatsRequest(), &stats).ok()) return "";
    auto names = context.auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    return names.empty() ? "" : std::string(names[0].data(), names[0].size());
  };
  EXPECT_EQ(served_name(), "kvstrata-kvstore");
  install("kvstore-next");
  const absl::Time give_up = absl::Now() + absl::Seconds(15);
  std::string name;
  while ((name = served_name()) != "kvstrata-kvstore-next" && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(name, "kvstrata-kvstore-next");
}

}  // namespace
}  // namespace kvstrata::kvstore
