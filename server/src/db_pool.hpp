// A small pool of database worker threads, one pqxx connection each.
// I/O threads never touch the database: they submit jobs here and the job
// posts its result back to the session's strand.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

namespace im {

class DbPool {
public:
    /// A job gets the worker's connection, or nullptr when the database
    /// cannot be reached right now (the job then answers UNAVAILABLE).
    using Job = std::function<void(pqxx::connection_base*)>;

    DbPool(std::string url, std::size_t workers, std::size_t max_queue);
    ~DbPool();
    DbPool(const DbPool&) = delete;
    DbPool& operator=(const DbPool&) = delete;

    /// Queues a job; false when the queue is full (pool exhausted).
    bool submit(Job job);
    void stop(); // finishes queued jobs, then joins the workers

    std::size_t in_use() const { return busy_.load(); }
    std::size_t queued() const;
    std::size_t size() const { return threads_.size(); }

private:
    void run(std::size_t index);

    std::string url_;
    std::size_t max_queue_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;
    bool stopping_ = false;
    std::atomic<std::size_t> busy_{0};
    std::vector<std::thread> threads_;
};

/// Opens a connection with a short connect timeout; throws on failure.
std::unique_ptr<pqxx::connection> open_connection(const std::string& url, const std::string& app_name);

} // namespace im
