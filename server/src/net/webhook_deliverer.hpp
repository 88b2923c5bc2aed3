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
// for any of this: the deliverer only reads the events table. What to claim:
// the conversations the notification bus announced as moved (moved(); a
// claim then reads only their cursors), and once per --webhook-sweep-ms
// every cursor of the webhook (what no announcement named).
#pragma once

#include "core/config.hpp"
#include "core/faults.hpp"
#include "core/metrics.hpp"
#include "store/store_webhooks.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
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

    /// Payloads of the notification bus (bus.hpp), from its thread: every
    /// "e CONV HI [LO]" marks CONV as moved up to HI for each registered
    /// webhook, so the next claims read that conversation's cursor (a hinted
    /// claim: primary-key probes of what moved) instead of every cursor. A
    /// hint is dropped once a claim shows the cursor at or past HI. Only a
    /// shortcut: a sweep of every cursor once per --webhook-sweep-ms finds
    /// anything no hint named.
    void moved(const std::vector<std::string>& payloads);
    /// The bus lost payloads (its subscription came back): the next round of
    /// every webhook sweeps.
    void resync();

private:
    void loop(int worker);

    using Clock = std::chrono::steady_clock;
    struct Hint {
        std::int64_t hi = 0;     // the highest seq announced
        Clock::time_point since; // first announced (a hint older than two sweeps is left to the sweep)
    };
    struct HookHints {
        std::unordered_map<std::string, Hint> convs;
        bool sweep_now = true;         // the first round of a webhook sweeps
        Clock::time_point next_sweep{}; // shared by this gateway's workers
    };
    /// What a worker's next claim of webhook `id` is: a sweep (true; `out`
    /// the hints as they are), a hinted claim over `out` (false, out not
    /// empty), or nothing to do (false, out empty).
    bool plan_claim(const std::string& id, std::vector<std::pair<std::string, std::int64_t>>& out);
    /// The hint of `conv` is dropped if it announced nothing past `done`.
    void settle(const std::string& id, const std::string& conv, std::int64_t done);
    /// After a sweep: a conversation it left behind (not caught up) is
    /// hinted; the next round sweeps again if the claim was full and took a
    /// conversation no hint named (`hinted`: the hints when it started).
    void swept(const std::string& id, const webhooks::ClaimedBatch& batch,
               const std::vector<std::pair<std::string, std::int64_t>>& hinted);
    void set_hooks(const std::vector<std::string>& ids);

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
    std::mutex hint_mu_;
    std::map<std::string, HookHints> hints_; // by webhook id: the registered ones (under hint_mu_)
};

} // namespace im
