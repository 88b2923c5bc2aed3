// On-device search, the thread (API layer): one worker thread per Client,
// started on the first search, with its own read-only connection to the
// store (detail::SearchReader). Requests are queued to it; each answer
// (hits with their matched ranges and snippet) comes back to the client's
// thread through `answer`. The client's thread never waits for a query.
#pragma once

#include <im/search.h>

#include <QtCore/QObject>
#include <QtCore/QStringList>
#include <QtCore/QThread>

#include <functional>
#include <memory>

namespace im::detail {

class SearchReader;

class SearchService : public QObject {
    Q_OBJECT
public:
    struct Answer {
        int id = 0;
        QList<SearchResult> results;
        bool more = false;
        QStringList incomplete, purged; // coverage of the searched conversations (first page only)
        bool indexComplete = true;
        QString error; // empty: fine
    };
    /// `owner` (on the client's thread) receives the answers.
    SearchService(const QString &storePath, QObject *owner, std::function<void(const Answer &)> answer);
    /// Stops the thread (after the query running now, if any).
    ~SearchService() override;

    /// Queues a query; returns its id (> 0).
    int search(const QString &query, const QString &conv, int limit, qint64 before);

private:
    class Worker;
    QThread thread_;
    Worker *worker_ = nullptr; // lives on thread_, deleted there
    int nextId_ = 0;
    std::function<void(const Answer &)> answer_;
};

/// The query run on the search thread (also used by the benchmark and the
/// tests without a thread): the hits of `query` with their ranges.
std::optional<QList<SearchResult>> runSearch(SearchReader &reader, const QString &query, const QString &conv,
                                             int limit, qint64 before, QString *error);

} // namespace im::detail
