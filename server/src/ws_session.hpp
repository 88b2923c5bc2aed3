// One WebSocket connection: one strand, one read and one write in flight, a
// FIFO of outgoing frames, requests handled one at a time in arrival order.
#pragma once

#include "api.hpp"
#include "net_common.hpp"

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

namespace im {

class Gateway;

class WsSession : public std::enable_shared_from_this<WsSession> {
public:
    WsSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw);

    void run(http::request<http::string_body> req);

    /// Queue a frame from any thread.
    void post_frame(std::string frame);
    void post_goaway();

    const std::optional<Identity>& identity() const { return who_; }
    std::string device() const { return who_ ? who_->device : std::string(); }

private:
    struct Pending {
        std::optional<std::string> rid;
        std::string type;
        Request req;
        std::chrono::steady_clock::time_point received;
    };

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
    void do_write();
    void on_write(beast::error_code ec, std::size_t);
    void goaway();
    void close(websocket::close_code code);
    void do_close();
    void shutdown();

    static constexpr std::size_t max_queued_ = 64;        // requests read ahead
    static constexpr std::size_t max_send_batch_ = 64;    // sends per transaction
    static constexpr std::size_t max_outgoing_ = 10000;   // frames waiting to be written

    websocket::stream<beast::tcp_stream> ws_;
    beast::flat_buffer buffer_;
    std::shared_ptr<Gateway> gw_;
    net::steady_timer ping_timer_;
    std::deque<std::string> out_;
    std::deque<Pending> queue_;
    std::optional<Identity> who_;
    websocket::close_code close_code_ = websocket::close_code::normal;
    using Clock = std::chrono::steady_clock;
    Clock::time_point last_rx_{}, last_ping_{};
    bool opened_ = false, reading_ = false, busy_ = false, pinging_ = false;
    bool draining_ = false, close_requested_ = false, closed_ = false;
};

} // namespace im
