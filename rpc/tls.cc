#include "rpc/tls.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace kvstrata::rpc {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " \"", path, "\": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " \"", path, "\": empty file"));
  }
  return text.str();
}

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM block found";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The certificates of a PEM file, first first; INVALID_ARGUMENT when there is none.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& pem,
                                                       const std::string& path, const char* what) {
  std::unique_ptr<BIO, BioDeleter> bio = MemoryBio(pem);
  std::vector<X509Ptr> certs;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  ERR_clear_error();  // the end of the file reads as an error
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", path, "\": no PEM certificate in the file"));
  }
  return certs;
}

absl::Status CheckFiles(const TlsFiles& files) {
  if (files.ca_file.empty()) {
    return absl::InvalidArgumentError("TLS: a CA file is required (--tls_ca)");
  }
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS: a certificate needs its key and a key its certificate (--tls_cert, --tls_key)");
  }
  absl::StatusOr<std::string> ca = ReadFile(files.ca_file, "TLS CA file");
  if (!ca.ok()) return ca.status();
  if (absl::StatusOr<std::vector<X509Ptr>> roots =
          ParseCertificates(*ca, files.ca_file, "TLS CA file");
      !roots.ok()) {
    return roots.status();
  }
  if (files.cert_file.empty()) return absl::OkStatus();

  absl::StatusOr<std::string> cert_pem = ReadFile(files.cert_file, "TLS certificate file");
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::vector<X509Ptr>> chain =
      ParseCertificates(*cert_pem, files.cert_file, "TLS certificate file");
  if (!chain.ok()) return chain.status();
  X509* leaf = chain->front().get();
  if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS certificate file \"", files.cert_file, "\": the certificate expired"));
  }
  absl::StatusOr<std::string> key_pem = ReadFile(files.key_file, "TLS key file");
  if (!key_pem.ok()) return key_pem.status();
  std::unique_ptr<BIO, BioDeleter> key_bio = MemoryBio(*key_pem);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TLS key file \"", files.key_file, "\": not a PEM private key (", OpenSslError(), ")"));
  }
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("TLS key file \"", files.key_file,
                                                   "\" does not belong to the certificate in \"",
                                                   files.cert_file, "\""));
  }
  return absl::OkStatus();
}

unsigned int ReloadSeconds(absl::Duration interval) {
  return static_cast<unsigned int>(std::max<int64_t>(1, absl::ToInt64Seconds(interval)));
}

}  // namespace

TransportSecurity TransportSecurity::Insecure() { return TransportSecurity(); }

absl::StatusOr<TransportSecurity> TransportSecurity::Tls(const TlsFiles& files) {
  if (absl::Status s = CheckFiles(files); !s.ok()) return s;
  TransportSecurity security;
  security.files_ = files;
  const unsigned int seconds = ReloadSeconds(files.reload_interval);
  if (files.cert_file.empty()) {
    security.provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        files.ca_file, seconds);
  } else {
    security.provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        files.key_file, files.cert_file, files.ca_file, seconds);
  }
  return security;
}

std::string TransportSecurity::Describe() const {
  if (insecure()) return "plaintext (--insecure: no encryption, no peer authentication)";
  return absl::StrCat("TLS (cert ", has_identity() ? files_.cert_file : "none", ", CA ",
                      files_.ca_file, ", files checked every ",
                      ReloadSeconds(files_.reload_interval), "s)");
}

std::string TransportSecurity::Describe(ClientCerts client_certs) const {
  if (insecure()) return Describe();
  switch (client_certs) {
    case ClientCerts::kRequire:
      return absl::StrCat(Describe(), ", client certificates required (mTLS)");
    case ClientCerts::kVerifyIfGiven:
      return absl::StrCat(Describe(), ", client certificates verified when given");
  }
  return Describe();
}

std::shared_ptr<grpc::ServerCredentials> TransportSecurity::ServerCredentials(
    ClientCerts client_certs) const {
  if (insecure()) return grpc::InsecureServerCredentials();
  KV_CHECK(has_identity()) << "a TLS server needs a certificate and key";
  grpc::experimental::TlsServerCredentialsOptions options(provider_);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  switch (client_certs) {
    case ClientCerts::kRequire:
      options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      break;
    case ClientCerts::kVerifyIfGiven:
      options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
      break;
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> TransportSecurity::ChannelCredentials() const {
  if (insecure()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider_);
  options.watch_root_certs();
  if (has_identity()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

grpc::ChannelArguments TransportSecurity::ChannelArgs() const {
  grpc::ChannelArguments args;
  if (!insecure() && !files_.server_name.empty()) {
    args.SetSslTargetNameOverride(files_.server_name);
  }
  return args;
}

std::shared_ptr<grpc::Channel> TransportSecurity::Dial(const std::string& target) const {
  return grpc::CreateCustomChannel(target, ChannelCredentials(), ChannelArgs());
}

}  // namespace kvstrata::rpc
