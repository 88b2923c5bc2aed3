// On-device search, the read side (storage layer): a read-only connection
// of its own to the store, used on the search thread only (WAL: it reads a
// committed snapshot while the client's connection writes). See
// storage_search.cpp for what the index holds.
#pragma once

#include <QtCore/QList>
#include <QtCore/QString>
#include <QtCore/QStringList>

#include <optional>

namespace im::detail {

struct SearchHit {
    qint64 position = 0; // the index rowid: newest first; the next page is below it
    QString conv;
    qint64 seq = 0;
    QString sender;
    qint64 ts = 0;
    QString body; // the current text
};

/// What a conversation's stored history lacks (obligation 18's "could
/// not search completely").
struct ConvCoverage {
    QString conv;
    qint64 gapSeqs = 0;  // seqs in gaps (history windows skipped them): loadable
    qint64 unsynced = 0; // seqs between the cursor and the known head: loadable
    qint64 purged = 0;   // seqs purged on the server before we saw them: never loadable
    bool loadable() const { return gapSeqs > 0 || unsynced > 0; }
};

class SearchReader {
public:
    explicit SearchReader(const QString &path);
    ~SearchReader();
    SearchReader(const SearchReader &) = delete;
    SearchReader &operator=(const SearchReader &) = delete;

    bool open();
    QString lastError() const { return error_; }
    /// Up to `limit` hits of the FTS5 query `fts` (searchtext::ftsQuery),
    /// in `conv` (empty: all), below `before` (0: from the newest), newest
    /// first.
    std::optional<QList<SearchHit>> search(const QString &fts, const QString &conv, qint64 before, int limit);
    /// The conversations (or `conv`) whose history is not all stored.
    std::optional<QList<ConvCoverage>> coverage(const QString &conv);
    // The vocabulary's entries that start with `prefix` (folded ASCII):
    // nothing when there are more than `cap` (or on an error).
    std::optional<QStringList> vocabulary(const QString &prefix, int cap);
    /// Whether the index build of an older store has finished.
    std::optional<bool> indexComplete();

private:
    QString path_, connection_, error_;
    bool open_ = false;
};

} // namespace im::detail
