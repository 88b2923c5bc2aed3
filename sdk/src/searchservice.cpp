// On-device search, the thread: see searchservice_p.h.
#include "searchservice_p.h"

#include "searchreader_p.h"
#include "searchresult_p.h"
#include "searchtext_p.h"

#include <QtCore/QPointer>

namespace im::detail {

class SearchService::Worker : public QObject {
public:
    explicit Worker(const QString &path) : reader(path) {}
    SearchReader reader;
};

SearchService::SearchService(const QString &storePath, QObject *owner, std::function<void(const Answer &)> answer)
    : QObject(owner) {
    thread_.setObjectName(QStringLiteral("imsdk-search"));
    worker_ = new Worker(storePath);
    worker_->moveToThread(&thread_);
    // Deleted on its own thread (its SQLite connection belongs there), as
    // the thread ends: `finished` is emitted from it.
    Worker *w = worker_;
    connect(&thread_, &QThread::finished, w, [w] { delete w; }, Qt::DirectConnection);
    // The answers go to the owner's thread, through this object (a child
    // of the owner: an answer arriving after it is gone is dropped).
    answer_ = std::move(answer);
    thread_.start(QThread::LowPriority);
}

SearchService::~SearchService() {
    thread_.quit();
    thread_.wait();
}

int SearchService::search(const QString &query, const QString &conv, int limit, qint64 before) {
    const int id = ++nextId_;
    QPointer<SearchService> self(this);
    Worker *w = worker_;
    QMetaObject::invokeMethod(w, [w, self, id, query, conv, limit, before] {
        Answer a;
        a.id = id;
        // One more than asked: whether there is a next page.
        const std::optional<QList<SearchResult>> found = runSearch(w->reader, query, conv, limit + 1, before, &a.error);
        if (found) {
            a.results = *found;
            a.more = a.results.size() > limit;
            if (a.more)
                a.results.resize(limit);
        }
        if (before <= 0 && a.error.isEmpty()) {
            const std::optional<QList<ConvCoverage>> cov = w->reader.coverage(conv);
            const std::optional<bool> complete = w->reader.indexComplete();
            if (!cov || !complete) {
                a.error = w->reader.lastError();
            } else {
                for (const ConvCoverage &c : *cov) {
                    if (c.loadable())
                        a.incomplete << c.conv;
                    if (c.purged > 0)
                        a.purged << c.conv;
                }
                a.indexComplete = *complete;
            }
        }
        if (!self)
            return;
        QMetaObject::invokeMethod(self.data(), [self, a] {
            if (self)
                self->answer_(a);
        }, Qt::QueuedConnection);
    }, Qt::QueuedConnection);
    return id;
}

std::optional<QList<SearchResult>> runSearch(SearchReader &reader, const QString &query, const QString &conv,
                                             int limit, qint64 before, QString *error) {
    // A last word as the whole words it stands for (at most kExpansion,
    // else FTS5's prefix query): see searchtext::vocabTerms().
    constexpr int kExpansion = 200;
    const QString fts = searchtext::ftsQuery(query, [&reader](const QString &prefix) {
        return reader.vocabulary(prefix, kExpansion);
    });
    if (fts.isEmpty())
        return QList<SearchResult>();
    const std::optional<QList<SearchHit>> hits = reader.search(fts, conv, before, limit);
    if (!hits) {
        if (error)
            *error = reader.lastError();
        return std::nullopt;
    }
    const QList<searchtext::Term> terms = searchtext::terms(query);
    QList<SearchResult> out;
    out.reserve(hits->size());
    for (const SearchHit &h : *hits) {
        SearchResult r;
        SearchResultData &d = SearchResultAccess::data(r);
        d.conv = h.conv;
        d.seq = h.seq;
        d.sender = h.sender;
        d.ts = h.ts;
        d.body = h.body;
        d.position = h.position;
        const QList<searchtext::Range> ranges = searchtext::matchedRanges(h.body, terms);
        for (const searchtext::Range &x : ranges)
            d.matches.append({x.start, x.length});
        const searchtext::Snippet s = searchtext::snippet(h.body, ranges);
        d.snippet = s.text;
        for (const searchtext::Range &x : s.ranges)
            d.snippetMatches.append({x.start, x.length});
        out.append(r);
    }
    return out;
}

} // namespace im::detail
