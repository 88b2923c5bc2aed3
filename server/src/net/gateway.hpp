// The gateway's shared state (Beast chat-multi's shared_state): the set of
// open WebSocket sessions and push subscriptions, the listener, and drain.
// The network layer is listener.*, http_session.*, ws_session.* and this.
// No SQL here: database work goes through DbPool + handle_request.
#pragma once

#include "api/api.hpp"
#include "api/presence.hpp"
#include "api/send_scheduler.hpp"
#include "core/address_limiter.hpp"
#include "core/write_limiter.hpp"
#include "core/config.hpp"
#include "store/db_pool.hpp"
#include "core/metrics.hpp"
#include "net/net_common.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace im {

class Attachments;
class Listener;
class TlsContexts;
class WsSession;

class Gateway : public std::enable_shared_from_this<Gateway> {
public:
    /// jwt: the signed-token keys, loaded (null: no signed tokens).
    Gateway(net::io_context& ioc, const Config& cfg, DbPool& pool, Store& store, Metrics& metrics,
            FaultRegistry& faults, std::unique_ptr<jwt::Verifier> jwt = nullptr);

    /// Binds and starts accepting; returns the bound port.
    unsigned short listen();
    /// With --metrics-listen HOST:PORT: binds the metrics listener; its port.
    std::optional<unsigned short> listen_metrics();
    /// SIGTERM: stop accepting, goaway to all, finish in-flight, close;
    /// calls done once every connection is gone or the drain timeout passed.
    void drain(std::function<void()> done);
    /// After the I/O threads have returned: drops the listener, which holds
    /// this gateway (the pair would otherwise keep each other alive).
    void release_listener() {
        listener_.reset();
        metrics_listener_.reset();
    }
    bool draining() const { return draining_.load(); }

    // Used by sessions.
    const Config& config() const { return cfg_; }
    DbPool& pool() { return pool_; }
    Metrics& metrics() { return metrics_; }
    FaultRegistry& faults() { return faults_; }
    ApiContext& api() { return api_; }
    /// The TLS contexts (nullptr: plain ws:// and http://).
    const std::shared_ptr<TlsContexts>& tls() const { return tls_; }
    /// SIGHUP: re-read the certificate and key (see TlsContexts::reload)
    /// and the JWT keys; a file that is unusable keeps the old ones.
    void reload_on_hup();
    SendScheduler& sends() { return sends_; }
    /// Sends, edits and reactions per user (--send-rate, --send-burst).
    WriteLimiter& write_limiter() { return write_limiter_; }
    void session_opened(const std::shared_ptr<WsSession>& s);
    void subscribe(const std::string& user, const std::shared_ptr<WsSession>& s);
    /// Takes a connection slot for a client address (counted under
    /// address_key: IPv6 by its /64); on a cap, returns the reason and takes
    /// nothing. Each successful admit is paired with release.
    std::optional<std::string> admit(const std::string& address);
    void release(const std::string& address);
    /// `user` is the one it subscribed as (empty if it never did): a
    /// disconnect costs O(its subscriptions).
    void session_closed(WsSession* s, const std::string& user);

    // Unauthenticated work (issue 24, item 5).
    /// /readyz: at most one database check a second; callers in between get
    /// the last answer. `done(ready, why)` may run on any thread.
    void readiness(std::function<void(bool ready, const char* why)> done);
    /// True when this client address used up its failed hellos for the
    /// minute (counted under address_key: IPv6 by its /64).
    bool hello_limited(const std::string& address);
    void hello_failed(const std::string& address);
    /// HTTP connections on --listen before their upgrade: a slot, or false
    /// at --max-http-connections. Each successful take is paired with put.
    bool take_http_slot();
    void put_http_slot();

    // The process-wide buffer budget (--max-buffered-bytes): every
    // connection's queued requests and unsent output, counted by the
    // connection (WsSession::hold / unhold).
    void buffered(long long delta);
    bool budget_reached() const;
    /// A connection that would read while the budget is reached waits here;
    /// the biggest holders are shed (closed 1013) until the rest hold at
    /// most three quarters of the budget, then the waiters read again.
    void wait_for_budget(const std::shared_ptr<WsSession>& s);
    /// Output queued past the budget: shed the biggest holders.
    void shed_soon();

    // Used by the notifier thread (push fan-out). Frames go to each
    // session's strand; these never block on a socket.
    /// The frame is encoded once and shared by every connection it goes to.
    void push_to_user(const std::string& user, const std::shared_ptr<const std::string>& frame,
                      const std::string& skip_device = {});
    /// The same frame to every session subscribed as one of `users` (sorted,
    /// unique), under one lock: walks whichever of `users` and the
    /// subscribed users is the smaller. The number of users reached.
    std::size_t push_to_users(const std::vector<std::string>& users, const std::shared_ptr<const std::string>& frame);
    bool has_subscribers(const std::string& user) const;
    bool has_any_subscriber() const;
    void resync_all();

    // Typing and presence (contract section 13; api/presence.hpp).
    /// Where this gateway's connections past welcome are counted (null: no presence).
    void set_presence(PresenceTracker* p) { presence_ = p; }
    /// The attachment routes' store (server.md "Attachments"; null: the
    /// routes answer 404). Set before listen().
    void set_attachments(Attachments* a) { attachments_ = a; }
    Attachments* attachments() const { return attachments_; }
    /// A presence reply's watch list replaces the connection's (strand of `s`).
    void watch(const std::shared_ptr<WsSession>& s, std::vector<std::string> users);
    /// A presence change from the bus: pushed to the connections watching
    /// the user, unless an equal or later version was pushed already.
    void push_presence(const PresenceInfo& p, std::int64_t version);
    /// The device was revoked or got a new token: close its connections
    /// (only those authenticated with `token_sha256`, when given).
    void close_device(const std::string& device, const std::string& token_sha256 = {});

    // Revocations missed while the bus was down (contract section 3): after
    // every resync the tokens of the open connections are checked against
    // the database, and the connections of tokens that stopped working
    // close, as if the missed notification had arrived.
    /// A connection proved `who` with a hello that started at generation
    /// `hello_generation` (resync_generation() then).
    void authenticated(WsSession* s, const Identity& who, std::uint64_t hello_generation);
    std::uint64_t resync_generation() const { return resync_generation_; }
    /// Checks every open connection's token; retried every second until the
    /// database answers. Any thread.
    void recheck_tokens();

private:
    net::io_context& ioc_;
    const Config& cfg_;
    DbPool& pool_;
    Metrics& metrics_;
    FaultRegistry& faults_;
    ApiContext api_;
    SendScheduler sends_;
    std::unique_ptr<jwt::Verifier> jwt_; // null: no signed tokens
    std::shared_ptr<Listener> listener_;
    std::shared_ptr<TlsContexts> tls_;
    std::atomic<bool> draining_{false};

    mutable std::mutex mu_;
    std::map<WsSession*, std::weak_ptr<WsSession>> sessions_;
    std::map<std::string, std::map<WsSession*, std::weak_ptr<WsSession>>> subscribers_;
    std::map<WsSession*, std::pair<std::string, std::string>> authed_; // device, token hash
    std::map<WsSession*, std::string> online_; // user of each connection past welcome (presence)
    PresenceTracker* presence_ = nullptr;
    Attachments* attachments_ = nullptr;
    TypingLimiter typing_;
    // Watch lists: user -> watching sessions, and each session's list.
    std::map<std::string, std::map<WsSession*, std::weak_ptr<WsSession>>> watchers_;
    std::map<WsSession*, std::vector<std::string>> watching_;
    std::map<std::string, std::int64_t> presence_version_; // watched users: the last version pushed
    void unwatch(WsSession* s); // holds mu_
    std::atomic<std::uint64_t> resync_generation_{0};
    int admitted_ = 0;
    std::map<std::string, int> per_address_; // by address_key; at most one entry per admitted connection
    std::shared_ptr<Listener> metrics_listener_;

    void shed();
    void wake_budget_waiters();
    bool counts_hello_failures(const std::string& address) const;

    std::mutex ready_mu_;
    bool ready_checking_ = false;
    std::optional<std::pair<bool, const char*>> ready_last_;
    std::chrono::steady_clock::time_point ready_at_{};
    std::vector<std::function<void(bool, const char*)>> ready_waiters_;

    AddressLimiter hello_failures_{cfg_.hello_failures};
    WriteLimiter write_limiter_{static_cast<double>(cfg_.send_rate), static_cast<double>(cfg_.send_burst)};

    std::atomic<int> http_pending_{0};

    std::mutex budget_mu_; // under mu_ when both are taken
    std::map<WsSession*, std::weak_ptr<WsSession>> budget_waiters_;
    std::atomic<bool> shedding_{false};
};

} // namespace im
