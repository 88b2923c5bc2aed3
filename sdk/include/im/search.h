// im::SearchResult and im::TextRange: what on-device search finds
// (Client::search(), im::SearchModel; docs/sdk.md "Search").
#pragma once

#include <im/global.h>

#include <QtCore/QList>
#include <QtCore/QMetaType>
#include <QtCore/QObject>
#include <QtCore/QSharedDataPointer>
#include <QtCore/QString>

namespace im {

namespace detail {
struct SearchResultAccess;
} // namespace detail

/// A part of a text that matched the query: UTF-16 offset and length (what
/// QString, QTextLayout and QML's string functions count in).
///
/// Kept a plain value of two ints (no private part, unlike SearchResult):
/// like QPoint or QSize it is complete by definition, so it never grows;
/// were a range ever to tell more, that would be a new type (docs/sdk.md
/// "Versions", 2.2.0). Its size is asserted by tst_api.
struct IM_SDK_EXPORT TextRange {
    Q_GADGET
    Q_PROPERTY(int start MEMBER start)
    Q_PROPERTY(int length MEMBER length)
public:
    int start = 0;
    int length = 0;
    bool operator==(const TextRange &o) const { return start == o.start && length == o.length; }
    bool operator!=(const TextRange &o) const { return !(*this == o); }
};

class SearchResultData;

/// One found message (Client::searchFinished(), SearchModel's rows). A
/// read-only value with a private part (implicitly shared, like
/// OutboxEntry): a later version can tell more about a result as a MINOR
/// change (docs/sdk.md "Versions").
class IM_SDK_EXPORT SearchResult {
    Q_GADGET
    Q_PROPERTY(QString conv READ conv)
    Q_PROPERTY(qint64 seq READ seq)
    Q_PROPERTY(QString sender READ sender)
    Q_PROPERTY(qint64 ts READ ts)
    Q_PROPERTY(QString body READ body)
    Q_PROPERTY(QList<im::TextRange> matches READ matches)
    Q_PROPERTY(QString snippet READ snippet)
    Q_PROPERTY(QList<im::TextRange> snippetMatches READ snippetMatches)
    Q_PROPERTY(qint64 position READ position)
public:
    /// An empty result (no conversation; every number 0).
    SearchResult();
    SearchResult(const SearchResult &other);
    SearchResult(SearchResult &&other) noexcept;
    SearchResult &operator=(const SearchResult &other);
    SearchResult &operator=(SearchResult &&other) noexcept;
    ~SearchResult();

    /// Conversation id.
    QString conv() const;
    /// The message's seq in its conversation.
    qint64 seq() const;
    QString sender() const;
    /// The server's commit time, ms since the epoch.
    qint64 ts() const;
    /// The current text (after edits).
    QString body() const;
    /// Where the query matched in body().
    QList<TextRange> matches() const;
    /// One line of body() around the first match ("…" where cut).
    QString snippet() const;
    /// The matches, in snippet().
    QList<TextRange> snippetMatches() const;
    /// The result's place in the order (newest first): pass it as `before`
    /// to Client::search() for the results after this one.
    qint64 position() const;

private:
    friend struct detail::SearchResultAccess; // fills it (sdk/src)
    QSharedDataPointer<SearchResultData> d;
};

} // namespace im

Q_DECLARE_METATYPE(im::TextRange)
Q_DECLARE_METATYPE(im::SearchResult)
