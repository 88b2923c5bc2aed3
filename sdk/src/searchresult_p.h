// The private part of im::SearchResult (im/search.h): what runSearch()
// fills. Not installed: a field added here changes no app's ABI.
#pragma once

#include <im/search.h>

#include <QtCore/QSharedData>

namespace im {

class SearchResultData : public QSharedData {
public:
    QString conv;
    qint64 seq = 0;
    QString sender;
    qint64 ts = 0;
    QString body;
    QList<TextRange> matches;
    QString snippet;
    QList<TextRange> snippetMatches;
    qint64 position = 0;
};

namespace detail {

// The SDK's way in (SearchResult is read-only for apps).
struct SearchResultAccess {
    static SearchResultData &data(SearchResult &r) { return *r.d; }
};

} // namespace detail

} // namespace im
