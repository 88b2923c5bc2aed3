#include <im/messagelistmodel.h>

#include "clientlink_p.h"
#include <im/client.h>

#include "client_p.h"
#include "modelroles_p.h"
#include "rowdiff_p.h"

#include <QtCore/QTimer>

#include <iterator>

#include <limits>

namespace im {

class MessageListModelPrivate {
public:
    QPointer<Client> client;
    QString conv;
    QList<detail::MessageRow> rows;
    QTimer reload;
    // The window: rows at or above this position are shown (-1: not chosen
    // yet; 0: everything, there are no events).
    qint64 floor = -1;
    int windowRows = 50;
    bool localOlder = false;             // events below the floor, in the local database
    std::optional<detail::Gap> bottom;   // missing events below everything local
    bool fetching = false;               // a fetchMore() waits for the server
    // The window follows the newest row: each refresh shows the newest
    // windowRows events and drops the oldest (docs/sdk.md, "Windows that
    // stay small"). Off once the user loaded older rows (fetchMore,
    // fillGap) until followNewest() or another conversation.
    bool following = true;
    // refresh() is running (its row diff emits signals to the app's slots);
    // a refresh asked for meanwhile runs right after it, never inside it.
    bool refreshing = false;
    bool refreshAgain = false;
    QList<QMetaObject::Connection> links; // to the current client
    // Downloads of attachments (AttachmentsRole), as the client reported
    // them while this model was linked to it.
    struct Download { QString state, path, errorCode; qint64 received = 0; };
    QHash<QString, Download> downloads;
    void downloadChanged(MessageListModel *m, const QString &attId) {
        for (qsizetype i = 0; i < rows.size(); ++i)
            for (const proto::Attachment &a : std::as_const(rows.at(i).attachments))
                if (a.id == attId) {
                    const QModelIndex at = m->index(int(i));
                    emit m->dataChanged(at, at, {MessageListModel::AttachmentsRole});
                    break;
                }
    }

    void forgetWindow() {
        rows.clear();
        floor = -1;
        localOlder = false;
        bottom.reset();
        following = true;
    }
};

MessageListModel::MessageListModel(Client *client, const QString &conversation, QObject *parent)
    : QAbstractListModel(parent), d(std::make_unique<MessageListModelPrivate>()) {
    d->conv = conversation;
    d->reload.setSingleShot(true);
    d->reload.setInterval(20); // coalesce bursts (a page, a resend storm) into one reload
    connect(&d->reload, &QTimer::timeout, this, &MessageListModel::refresh);
    setClient(client);
    if (!client)
        refresh();
}

MessageListModel::~MessageListModel() = default;

Client *MessageListModel::client() const { return d->client.data(); }

void MessageListModel::setClient(Client *client) {
    if (!detail::relink(d->client, d->links, client))
        return;
    beginResetModel();
    d->forgetWindow();
    d->downloads.clear();
    endResetModel();
    if (std::exchange(d->fetching, false))
        emit loadingOlderChanged();
    if (client) {
        ClientPrivate *cp = ClientPrivate::get(client);
        d->links << connect(cp, &ClientPrivate::timelineChanged, this, [this](const QString &c) {
            if (c == d->conv && !d->reload.isActive())
                d->reload.start();
        });
        // The app's own message shows before send() returns (obligation 1);
        // other changes are coalesced by the timer above.
        d->links << connect(cp, &ClientPrivate::draftWritten, this, [this](const QString &c) {
            if (c == d->conv)
                refresh();
        });
        d->links << connect(&cp->sync, &Sync::windowLoaded, this, [this](const QString &c, bool ok) {
            if (c != d->conv || !d->fetching)
                return;
            d->fetching = false;
            emit loadingOlderChanged();
            if (ok && d->floor > 0 && d->client) {
                // The window that came in lies below the shown rows: show it.
                const std::optional<qint64> f =
                    ClientPrivate::get(d->client.data())->storage.floorFor(d->conv, d->floor, d->windowRows);
                if (f && *f > 0)
                    d->floor = *f;
            }
            refresh();
        });
        // Attachments' downloads (AttachmentsRole).
        d->links << connect(cp->downloads, &detail::Downloads::progress, this,
                            [this](const QString &att, qint64 received, qint64) {
                                auto &x = d->downloads[att];
                                x.state = QStringLiteral("downloading");
                                x.received = received;
                                d->downloadChanged(this, att);
                            });
        d->links << connect(cp->downloads, &detail::Downloads::finished, this,
                            [this](const QString &att, const QString &path) {
                                auto &x = d->downloads[att];
                                x.state = QStringLiteral("done");
                                x.path = path;
                                x.errorCode.clear();
                                d->downloadChanged(this, att);
                            });
        d->links << connect(cp->downloads, &detail::Downloads::failed, this,
                            [this](const QString &att, const QString &code, const QString &) {
                                auto &x = d->downloads[att];
                                x.state = QStringLiteral("failed");
                                x.errorCode = code;
                                d->downloadChanged(this, att);
                            });
        // Our files' uploads (UploadProgressRole).
        d->links << connect(&cp->outbox, &Outbox::uploadProgress, this, [this](const QString &cmid, qint64, qint64) {
            for (qsizetype i = 0; i < d->rows.size(); ++i)
                if (d->rows.at(i).cmid == cmid) {
                    const QModelIndex at = index(int(i));
                    emit dataChanged(at, at, {UploadProgressRole});
                    break;
                }
        });
        // Private signals only (an app may disconnect() its Client).
        d->links << connect(cp, &ClientPrivate::identityChanged, this, [this] { d->reload.start(); });
        d->links << connect(cp, &ClientPrivate::aboutToBeDestroyed, this, [this] { setClient(nullptr); });
    }
    refresh();
    emit countChanged();
    emit clientChanged();
}

QString MessageListModel::conversation() const { return d->conv; }

void MessageListModel::setConversation(const QString &conv) {
    if (conv == d->conv)
        return;
    d->conv = conv;
    beginResetModel();
    d->forgetWindow();
    endResetModel();
    if (std::exchange(d->fetching, false))
        emit loadingOlderChanged();
    emit conversationChanged();
    refresh();
    emit countChanged(); // the reset may have changed it even if refresh() sees no difference
}

int MessageListModel::count() const { return int(d->rows.size()); }
bool MessageListModel::isLoadingOlder() const { return d->fetching; }
int MessageListModel::windowRows() const { return d->windowRows; }

void MessageListModel::setWindowRows(int rows) {
    rows = std::max(1, rows);
    if (rows == d->windowRows)
        return;
    d->windowRows = rows;
    emit windowRowsChanged();
    // Following the newest row, the window is windowRows rows: the next
    // refresh shows that many.
    if (d->following) {
        refresh();
        return;
    }
    // Holding older rows: a larger window shows more of what is stored at
    // once (never fewer rows).
    if (d->floor > 0 && d->client) {
        ClientPrivate *cp = ClientPrivate::get(d->client.data());
        const std::optional<qint64> f = cp->storage.floorFor(d->conv, std::numeric_limits<qint64>::max(), rows);
        if (f && *f > 0 && *f < d->floor) {
            d->floor = *f;
            refresh();
        }
    }
}

bool MessageListModel::isFollowingNewest() const { return d->following; }

void MessageListModel::followNewest() {
    if (d->following)
        return;
    d->following = true;
    emit followingNewestChanged();
    refresh();
}

void MessageListModel::refresh() {
    d->reload.stop();
    // Not re-entrant: an app's slot (a QML delegate's handler, a
    // rowsInserted slot) that sends, or calls refresh(), while this one's
    // row diff emits, would diff against rows half updated and show rows
    // twice. It runs once this one is done, before refresh() returns.
    if (d->refreshing) {
        d->refreshAgain = true;
        return;
    }
    d->refreshing = true;
    do {
        d->refreshAgain = false;
        refreshOnce();
    } while (d->refreshAgain);
    d->refreshing = false;
}

void MessageListModel::refreshOnce() {
    QList<detail::MessageRow> fresh;
    if (d->client && !d->conv.isEmpty()) {
        ClientPrivate *cp = ClientPrivate::get(d->client.data());
        if (cp->storage.isOpen()) {
            detail::Storage &st = cp->storage;
            if (d->following || d->floor <= 0) {
                // Nothing shown yet, or following the newest row: the newest
                // windowRows events (an arrival drops the oldest row).
                const std::optional<qint64> f = st.floorFor(d->conv, std::numeric_limits<qint64>::max(), d->windowRows);
                if (!f) {
                    cp->storageFailed(QStringLiteral("cannot read messages"));
                    return;
                }
                d->floor = *f;
            }
            // Only the window is read: what is shown, not the conversation.
            std::optional<QList<detail::MessageRow>> rows = st.messages(d->conv, cp->id.userId, d->floor);
            const std::optional<QList<detail::Gap>> gaps = st.gaps(d->conv);
            const std::optional<bool> older = d->floor > 0 ? st.hasEventsBelow(d->conv, d->floor) : false;
            std::optional<bool> belowFirstGap = false;
            if (gaps && !gaps->isEmpty())
                belowFirstGap = st.hasEventsBelow(d->conv, gaps->first().lo);
            if (!rows || !gaps || !older || !belowFirstGap) {
                cp->storageFailed(QStringLiteral("cannot read messages"));
                return;
            }
            // Held drafts (obligation 10) show as such: from the outbox in memory.
            for (detail::MessageRow &r : *rows)
                r.held = !r.cmid.isEmpty() && r.state == int(MessageState::Pending) && cp->outbox.isHeld(r.cmid);
            // Our edits and reactions still in the outbox show at once (obligation 16).
            cp->outbox.showPendingChanges(d->conv, *rows);
            cp->fillQuotes(d->conv, *rows);
            d->localOlder = *older;
            d->bottom.reset();
            if (!gaps->isEmpty() && !*belowFirstGap)
                d->bottom = gaps->first(); // reached by fetchMore, not shown as a row
            // Gap markers between shown rows, where they belong by seq.
            qsizetype next = 0;
            for (const detail::Gap &g : *gaps) {
                if (d->bottom && g == *d->bottom)
                    continue;
                if (g.lo <= d->floor)
                    continue; // below the window: shown once older rows are
                while (next < rows->size() && rows->at(next).pos < double(g.lo))
                    ++next;
                detail::MessageRow gap;
                gap.pos = double(g.lo);
                gap.kind = QStringLiteral("gap");
                gap.gapLo = g.lo;
                gap.gapHi = g.hi;
                rows->insert(next, gap);
                ++next;
            }
            // Newest first (obligation 15): row 0 is the newest, the model's
            // end is the oldest, so a view's own fetchMore() at the end means
            // "older", and a view kept at the newest row never pulls history.
            fresh.reserve(rows->size());
            std::move(rows->rbegin(), rows->rend(), std::back_inserter(fresh));
        }
    }
    const int before = int(d->rows.size());
    detail::RowDiffOps ops;
    ops.beginRemove = [this](int a, int b) { beginRemoveRows({}, a, b); };
    ops.endRemove = [this] { endRemoveRows(); };
    ops.beginInsert = [this](int a, int b) { beginInsertRows({}, a, b); };
    ops.endInsert = [this] { endInsertRows(); };
    ops.beginReset = [this] { beginResetModel(); };
    ops.endReset = [this] { endResetModel(); };
    ops.changed = [this](int r) { emit dataChanged(index(r), index(r)); };
    detail::applyRowDiff(d->rows, fresh, [](const detail::MessageRow &r) { return r.key(); }, ops);
    if (before != int(d->rows.size()))
        emit countChanged();
}

bool MessageListModel::canFetchMore(const QModelIndex &parent) const {
    if (parent.isValid() || d->fetching)
        return false;
    return d->localOlder || d->bottom.has_value();
}

void MessageListModel::fetchMore(const QModelIndex &parent) {
    if (parent.isValid() || d->fetching || !d->client)
        return;
    ClientPrivate *cp = ClientPrivate::get(d->client.data());
    if (d->localOlder) {
        const std::optional<qint64> f = cp->storage.floorFor(d->conv, d->floor, d->windowRows);
        if (!f) {
            cp->storageFailed(QStringLiteral("cannot read messages"));
            return;
        }
        if (*f > 0)
            d->floor = *f;
        holdOlder();
        refresh();
    } else if (d->bottom) {
        holdOlder();
        d->fetching = true;
        emit loadingOlderChanged();
        cp->sync.loadOlder(d->conv, d->bottom->hi + 1, d->bottom->lo);
    }
}

bool MessageListModel::fillGap(int row) {
    if (row < 0 || row >= d->rows.size() || d->rows.at(row).gapHi <= 0 || !d->client)
        return false;
    const detail::MessageRow g = d->rows.at(row);
    // The rows around the gap stay while it fills (the user is reading there).
    holdOlder();
    ClientPrivate::get(d->client.data())->sync.loadOlder(d->conv, g.gapHi + 1, g.gapLo);
    return true;
}

void MessageListModel::holdOlder() {
    if (!d->following)
        return;
    d->following = false;
    emit followingNewestChanged();
}

int MessageListModel::rowCount(const QModelIndex &parent) const {
    return parent.isValid() ? 0 : int(d->rows.size());
}

QVariant MessageListModel::data(const QModelIndex &index, int role) const {
    if (!index.isValid() || index.row() < 0 || index.row() >= d->rows.size())
        return {};
    const detail::MessageRow &r = d->rows.at(index.row());
    switch (role) {
    case Qt::DisplayRole:
    case BodyRole: return r.body;
    case SenderRole: return r.sender;
    case SeqRole: return r.seq;
    case StateRole: return r.state;
    case ErrorCodeRole: return r.errorCode;
    case CmidRole: return r.cmid;
    case TimestampRole: return QDateTime::fromMSecsSinceEpoch(r.ts);
    case KindRole: return r.kind;
    case DupRole: return r.dup;
    case IsOwnRole: return r.own;
    case UserRole: return r.user;
    case GapFromRole: return r.gapLo;
    case GapToRole: return r.gapHi;
    case HeldRole: return r.held;
    case EditedRole: return r.edited;
    case ReplyToRole: return r.replyTo;
    case QuoteSenderRole: return r.quoteSender;
    case QuoteTextRole: return r.quoteBody.section(u'\n', 0, 0);
    case ReactionsRole: {
        QVariantList list;
        for (const proto::Reaction &x : r.reactions)
            list.append(QVariantMap{{QStringLiteral("emoji"), x.emoji},
                                    {QStringLiteral("count"), int(x.count)},
                                    {QStringLiteral("mine"), x.me}});
        return list;
    }
    case ChangePendingRole: return r.changePending;
    case AttachmentsRole: {
        QVariantList list;
        for (const proto::Attachment &a : r.attachments) {
            const auto x = d->downloads.value(a.id);
            list.append(QVariantMap{{QStringLiteral("id"), a.id},
                                    {QStringLiteral("name"), a.name},
                                    {QStringLiteral("mime"), a.mime},
                                    {QStringLiteral("size"), a.size},
                                    {QStringLiteral("sha256"), a.sha256},
                                    {QStringLiteral("downloadState"), x.state},
                                    {QStringLiteral("received"), x.received},
                                    {QStringLiteral("path"), x.path},
                                    {QStringLiteral("errorCode"), x.errorCode}});
        }
        return list;
    }
    case UploadProgressRole: {
        if (r.cmid.isEmpty() || r.seq > 0 || !d->client)
            return -1.0;
        const QVariantMap st = d->client->uploadState(r.cmid);
        const qint64 total = st.value(QStringLiteral("total")).toLongLong();
        if (st.isEmpty())
            return -1.0;
        return total > 0 ? double(st.value(QStringLiteral("sent")).toLongLong()) / double(total) : 1.0;
    }
    default: return {};
    }
}

QVariant MessageListModel::get(int row, int role) const { return data(index(row), role); }

QVariant MessageListModel::get(int row, const QString &roleName) const {
    return detail::valueByRoleName(this, row, roleName);
}

QVariantMap MessageListModel::get(int row) const { return detail::rowByRoleName(this, row); }

QHash<int, QByteArray> MessageListModel::roleNames() const {
    return {{BodyRole, "body"},         {SenderRole, "sender"}, {SeqRole, "seq"},
            {StateRole, "messageState"}, {ErrorCodeRole, "errorCode"}, {CmidRole, "cmid"},
            {TimestampRole, "timestamp"}, {KindRole, "kind"},   {DupRole, "dup"},
            {IsOwnRole, "isOwn"},       {UserRole, "user"},
            {GapFromRole, "gapFrom"},   {GapToRole, "gapTo"},
            {HeldRole, "held"},
            {EditedRole, "edited"},     {ReplyToRole, "replyTo"}, {QuoteSenderRole, "quoteSender"},
            {QuoteTextRole, "quoteText"}, {ReactionsRole, "reactions"}, {ChangePendingRole, "changePending"},
            {AttachmentsRole, "attachments"}, {UploadProgressRole, "uploadProgress"}};
}

} // namespace im
