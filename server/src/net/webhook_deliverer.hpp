// The webhook deliverer (server.md "Events to the app's backend (webhooks)";
// docs/operations.md, "Webhooks"). Every gateway runs --webhook-workers of
// them, each on its own thread with its own database session; the database
// decides who delivers what: a worker leases conversations with work (a
// row of webhook_cursors, FOR UPDATE SKIP LOCKED, --webhook-lease-ms) and
// reads their committed events past the cursor as a page shows them (the
// backend's view) in the same statement (webhooks::claim_pages), POSTs them
// in one signed batch of at most --webhook-batch (100) with Beast's HTTP client (plain or TLS, --webhook-timeout-ms), and moves the
// cursors on a 2xx. Anything else is retried with backoff (1 s doubling to
// --webhook-retry-max-ms, with jitter); a batch failing for longer than
// --webhook-give-up-ms (72 h) is recorded as failed and passed. A killed
// gateway's leases run out and another takes them over. A send never waits
// for any of this: the deliverer only reads the events table.
#pragma once

#include "core/config.hpp"
#include "core/faults.hpp"
#include "core/metrics.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace im {

/// "v1=" + hex HMAC-SHA256(secret, timestamp + "." + body): X-Im-Signature.
std::string webhook_signature(const std::string& secret, const std::string& timestamp, const std::string& body);

/// An http:// or https:// URL taken apart; nullopt if it is neither.
struct WebhookUrl {
    bool tls = false;
    std::string host, port, target;
};
std::optional<WebhookUrl> parse_webhook_url(const std::string& url);

/// One POST with Beast's client. status 0: no answer (error says why:
/// resolve, connect, TLS, timeout ...). insecure: no certificate check (tests only).
struct HttpOutcome {
    int status = 0;
    std::string error;
};
HttpOutcome webhook_post(const WebhookUrl& url, const std::vector<std::pair<std::string, std::string>>& headers,
                         const std::string& body, std::chrono::milliseconds timeout, bool insecure = false);

class WebhookDeliverer {
public:
    /// faults: the gateway's (the lab's rule.webhook_retry only).
    WebhookDeliverer(std::string url, const Config& cfg, Metrics& metrics, FaultRegistry& faults);
    ~WebhookDeliverer();
    /// Ends the workers (an HTTP call in flight finishes or times out first;
    /// its leases then run out and another gateway delivers again). A worker
    /// still blocked on the database 2 s after the request to stop (a hung
    /// PostgreSQL) has its session's socket shut down, so SIGTERM never waits
    /// on the database.
    void stop();

private:
    void loop(int worker);

    std::string url_;
    const Config& cfg_;
    Metrics& metrics_;
    FaultRegistry& faults_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    int running_ = 0;                      // workers not returned yet (under mu_)
    std::vector<pqxx::connection*> live_;  // the workers' open sessions (under mu_)
    std::vector<std::thread> threads_;
};

} // namespace im
