// One WebSocket connection: one strand, one read and one write in flight, a
// FIFO of outgoing frames, requests handled one at a time in arrival order.
#pragma once

#include "api/api.hpp"
#include "net/client_address.hpp"
#include "net/net_common.hpp"
#include "net/tls.hpp"
#include "net/ws_stream.hpp"

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

namespace im {

class Gateway;

class WsSession : public std::enable_shared_from_this<WsSession> {
public:
    /// `client`: who the upgrade request came from (behind a trusted proxy,
    /// the address it named); every per-address limit counts it.
    WsSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw, ClientAddress client);
    /// Over TLS: the stream after its handshake, and the context it used.
    WsSession(tls_stream&& stream, std::shared_ptr<ssl::context> tls, std::shared_ptr<Gateway> gw,
              ClientAddress client);
    ~WsSession();

    void run(http::request<http::string_body> req);

    /// Queue a (shared) frame from any thread.
    void post_frame(std::shared_ptr<const std::string> frame);
    void post_goaway();
    /// The device was revoked: close this connection if it is that device's.
    void post_revoked(std::string device, std::string token_sha256 = {});

    /// The process-wide buffer budget (Gateway::shed): bytes this connection
    /// holds (queued and in-flight requests, unsent output), from any thread.
    long long held() const { return held_.load(); }
    /// Marks it for shedding; false if it was already.
    bool mark_shed() { return !shed_.exchange(true); }
    bool shed_marked() const { return shed_.load(); }
    /// Closes it with 1013, dropping its queued requests and unsent output.
    void post_shed();
    /// The budget has room again: read on.
    void post_budget_resume();

    const std::optional<Identity>& identity() const { return who_; }
    std::string device() const { return who_ ? who_->device : std::string(); }

private:
    struct Pending {
        std::optional<std::string> rid;
        std::string type;
        Request req;
        std::chrono::steady_clock::time_point received;
        std::size_t bytes = 0; // the frame's size, held against the buffer budget until answered
        /// A frame that did not parse: answered with this error in its turn
        /// (replies keep the order of the frames; `req` is unused).
        std::optional<Error> refused;
        /// Read after this connection's goaway: answered UNAVAILABLE (the
        /// ones read before are finished, contract 7).
        bool after_goaway = false;
    };
    void hold(std::size_t n);
    void unhold(std::size_t n);
    void clear_queue();
    void shed();

    void on_accept(beast::error_code ec);
    void schedule_tick();
    void tick();
    void do_read();
    void on_read(beast::error_code ec, std::size_t);
    void on_frame(const std::string& text);
    void next();
    bool deliver(const Pending& item, Handled h);
    void after_reply();
    void finish(const Pending& item, Handled h);
    void send(std::string frame);
    void send(std::shared_ptr<const std::string> frame);
    void do_write();
    void on_write(beast::error_code ec, std::size_t);
    void goaway();
    // Signed tokens (contract section 4a): token_expiring 60 s before exp,
    // close 4001 at exp; refresh swaps the token's exp.
    void arm_token_timer();
    void wait_token_timer(std::uint64_t gen);
    void on_token_timer(std::uint64_t gen);
    bool token_past_exp() const;
    void token_expired();
    Handled refresh(const req::Refresh& r, const std::optional<std::string>& rid);
    void revoked(const std::string& device, const std::string& token_sha256);
    void drop_unsent();
    void close(websocket::close_reason reason);
    void do_close();
    void shutdown();

    static constexpr std::size_t max_queued_ = 64;        // requests read ahead
    static constexpr std::size_t max_send_batch_ = 64;    // sends per transaction

    net::any_io_executor executor() { return ws_->get_executor(); }
    /// "-" when the client came without a trusted proxy (log fields).
    std::string proxy() const { return client_.proxy.empty() ? std::string("-") : client_.proxy; }

    std::shared_ptr<ssl::context> tls_;   // outlives ws_ (nullptr: plain)
    std::unique_ptr<WsStream> ws_;        // plain or TLS (ws_stream.hpp)
    beast::flat_buffer buffer_;
    std::shared_ptr<Gateway> gw_;
    net::steady_timer ping_timer_;
    net::steady_timer token_timer_;        // JWT connections: token_expiring, then 4001
    std::uint64_t token_gen_ = 0;          // bumped by each (re)arm: stale waits do nothing
    RefreshBudget refresh_budget_;         // refresh's signature checks of the last minute
    bool token_warned_ = false;            // token_expiring sent for the current token
    std::deque<std::shared_ptr<const std::string>> out_;
    std::deque<Pending> queue_;
    std::optional<Identity> who_;
    std::uint64_t hello_generation_ = 0; // the gateway's resync generation when the hello went out
    websocket::close_reason close_reason_{websocket::close_code::normal};
    using Clock = std::chrono::steady_clock;
    Clock::time_point last_rx_{}, last_ping_{}, opened_at_{}, write_started_{};
    ClientAddress client_;                // the client's IP address (connection caps, failed hellos)
    std::optional<std::string> reject_;   // over a cap: why
    std::size_t out_bytes_ = 0;           // bytes in out_ (the unsent output budget)
    bool admitted_ = false, opened_ = false, reading_ = false, busy_ = false, pinging_ = false, subscribed_ = false;
    bool draining_ = false, close_requested_ = false, closed_ = false;
    bool hello_pending_ = false;          // a hello was read and waits for its answer (hello deadline)
    bool budget_wait_ = false;            // reading waits for the process-wide buffer budget
    std::atomic<long long> held_{0};      // bytes counted against the buffer budget
    std::atomic<bool> shed_{false};
    bool read_paused_ = false, output_paused_ = false, writing_ = false, revoked_ = false, expired_ = false;
};

} // namespace im
