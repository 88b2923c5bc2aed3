// im::SearchResult and im::TextRange: what on-device search finds
// (Client::search(), im::SearchModel; docs/sdk.md "Search").
#pragma once

#include <im/global.h>

#include <QtCore/QList>
#include <QtCore/QMetaType>
#include <QtCore/QObject>
#include <QtCore/QString>

namespace im {

/// A part of a text that matched the query: UTF-16 offset and length (what
/// QString, QTextLayout and QML's string functions count in).
struct IM_SDK_EXPORT TextRange {
    Q_GADGET
    Q_PROPERTY(int start MEMBER start)
    Q_PROPERTY(int length MEMBER length)
public:
    int start = 0;
    int length = 0;
    bool operator==(const TextRange &o) const { return start == o.start && length == o.length; }
};

/// One found message (Client::searchFinished(), SearchModel's rows).
struct IM_SDK_EXPORT SearchResult {
    QString conv;
    qint64 seq = 0;
    QString sender;
    qint64 ts = 0;    ///< the server's commit time, ms since the epoch
    QString body;     ///< the current text (after edits)
    QList<TextRange> matches; ///< where the query matched in body
    QString snippet;  ///< one line of body around the first match ("…" where cut)
    QList<TextRange> snippetMatches; ///< the matches, in snippet
    /// The result's place in the order (newest first): pass it as `before`
    /// to Client::search() for the results after this one.
    qint64 position = 0;
};

} // namespace im

Q_DECLARE_METATYPE(im::SearchResult)
