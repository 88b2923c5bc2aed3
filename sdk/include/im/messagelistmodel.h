// im::MessageListModel: the timeline of one conversation, from the local database.
#pragma once

#include <im/client.h>
#include <im/global.h>
#include <im/types.h>

#include <QtCore/QAbstractListModel>
#include <QtCore/QPointer>

#include <memory>

namespace im {

class MessageListModelPrivate;

/**
 * The messages of one conversation as a list model, NEWEST FIRST: row 0 is
 * the newest, our own messages not yet confirmed (Pending, newest first)
 * come before the events applied from the server (by seq, descending), and
 * the last row is the oldest one loaded. Updated live as the Client applies
 * pages, pushes and replies (row inserts, removals and changes; never a
 * reset for a new event; a new message is a row inserted at 0). Recall
 * events are not rows: the recalled message shows state Recalled.
 *
 * A window of history: the model holds the newest rows (windowRows) and
 * loads older ones through fetchMore() (from the local database, else from
 * the server's `history`), appended at the end. Qt's views call fetchMore()
 * when they reach the model's last row, so that is "older" here: show the
 * model bottom to top, as Qt chat clients do (QML ListView with
 * `verticalLayoutDirection: ListView.BottomToTop`); a view kept at the
 * newest message then never pulls history by itself (obligation 15). For a
 * Widgets QListView see docs/sdk.md, "Timelines in views". Events this
 * install skipped after a long absence show as one row of kind "gap"
 * (GapFromRole..GapToRole); fillGap(row) loads its newest part. See
 * docs/sdk.md, "History windows".
 *
 * A window that stays small: while it follows the newest row
 * (followingNewest, the default) the model shows the newest windowRows
 * events (plus our unconfirmed messages and gap rows), and every arrival
 * drops the oldest row, however long the conversation stays open. Once the
 * user loads older rows (fetchMore(), fillGap()) nothing is dropped from
 * under him: arrivals are added and the rows he is reading stay, until the
 * app calls followNewest() (when its view is back at the newest row) or
 * shows another conversation. See docs/sdk.md, "Windows that stay small".
 *
 * Newest at the bottom in a Widgets view: put an im::ReversedProxyModel
 * between this model and the view.
 */
class IM_SDK_EXPORT MessageListModel : public QAbstractListModel {
    Q_OBJECT
    /// The Client whose database is shown; may be set (or changed) after
    /// construction, as QML does. Without one the model is empty.
    Q_PROPERTY(im::Client *client READ client WRITE setClient NOTIFY clientChanged)
    Q_PROPERTY(QString conversation READ conversation WRITE setConversation NOTIFY conversationChanged)
    Q_PROPERTY(int count READ count NOTIFY countChanged)
    Q_PROPERTY(bool loadingOlder READ isLoadingOlder NOTIFY loadingOlderChanged)
    Q_PROPERTY(int windowRows READ windowRows WRITE setWindowRows NOTIFY windowRowsChanged)
    /// The window follows the newest row (stays windowRows rows long);
    /// false after the user loaded older rows, until followNewest().
    Q_PROPERTY(bool followingNewest READ isFollowingNewest NOTIFY followingNewestChanged)
public:
    enum Roles {
        BodyRole = Qt::UserRole + 1, ///< QString message text (also Qt::DisplayRole)
        SenderRole,     ///< QString user id of the sender
        SeqRole,        ///< qint64 seq, 0 while not known
        StateRole,      ///< int im::MessageState
        ErrorCodeRole,  ///< QString error code of a Failed / Expired message
        CmidRole,       ///< QString cmid of our own messages (empty for others')
        TimestampRole,  ///< QDateTime commit time (creation time while pending)
        KindRole,       ///< QString "msg", "join" or "leave"
        DupRole,        ///< bool: the send reply said dup:true (a resend hit the original)
        IsOwnRole,      ///< bool: sent by this user
        UserRole,       ///< QString the user who joined / left (join/leave)
        GapFromRole,    ///< qint64 first missing seq of a "gap" row (0 otherwise)
        GapToRole,      ///< qint64 last missing seq of a "gap" row (0 otherwise)
        HeldRole,       ///< bool: a Pending draft of ours that is held (Client::isHeld()):
                        ///< written as another user, never sent in this store's sessions
        // Contract section 12 (docs/sdk.md, "Replies, edits, reactions").
        // BodyRole is the current body: the winning edit's, or ours while
        // our edit is still in the outbox.
        EditedRole,        ///< bool: the body is an edit's (also while ours is pending)
        ReplyToRole,       ///< qint64 seq of the message this one answers (0: not a reply)
        QuoteSenderRole,   ///< QString sender of the replied-to message (empty until known)
        QuoteTextRole,     ///< QString first line of its current body (empty until known)
        /// QVariantList of QVariantMap {emoji: QString, count: int, mine: bool},
        /// most counted first; our reactions still in the outbox included
        ReactionsRole,
        ChangePendingRole, ///< bool: an edit or reaction of ours on it is still in the outbox
        /// QVariantList of QVariantMap, one per file of the message (obligation
        /// 17, docs/sdk.md "Receiving files"): {id, name, mime, size (qint64),
        /// sha256, downloadState: "" | "downloading" | "done" | "failed",
        /// received (qint64 bytes on disk while downloading), path (where the
        /// last download put it), errorCode (of a failed one)}
        AttachmentsRole,
        /// double 0..1: how much of the file of our Pending sendFile() message
        /// is at the server (Client::uploadState, uploadProgress); -1 for a
        /// row with no upload under way
        UploadProgressRole,
    };
    Q_ENUM(Roles)

    explicit MessageListModel(Client *client = nullptr, const QString &conversation = {}, QObject *parent = nullptr);
    ~MessageListModel() override;

    Client *client() const;
    void setClient(Client *client);

    QString conversation() const;
    void setConversation(const QString &conv);
    int count() const;
    bool isLoadingOlder() const;
    /// Rows shown while following the newest row, and added by each
    /// fetchMore() (default 50, at least 1).
    int windowRows() const;
    void setWindowRows(int rows);
    bool isFollowingNewest() const;

    /// Older events exist (locally or on the server) and no load is running.
    bool canFetchMore(const QModelIndex &parent = QModelIndex()) const override;
    /// Shows windowRows more older rows: from the local database, or (when
    /// none are left there) a `history` window from the server, appended at
    /// the end (the oldest end) when it arrives.
    void fetchMore(const QModelIndex &parent = QModelIndex()) override;
    /// Loads the newest part of the gap shown at `row` (a row of kind "gap").
    Q_INVOKABLE bool fillGap(int row);

    int rowCount(const QModelIndex &parent = QModelIndex()) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QHash<int, QByteArray> roleNames() const override;

    /// Value of `role` (a Roles value) at `row`.
    Q_INVOKABLE QVariant get(int row, int role) const;
    /// Value of the role called `roleName` (a roleNames() name) at `row`.
    Q_INVOKABLE QVariant get(int row, const QString &roleName) const;
    /// Every role of `row` by role name (QML: `model.get(0).body`); empty if no such row.
    Q_INVOKABLE QVariantMap get(int row) const;

public Q_SLOTS:
    /// Re-reads the database now (normally done automatically). Called
    /// while a refresh is emitting its row changes (from a slot connected
    /// to them), it runs right after that one, not inside it.
    void refresh();
    /// Back to the newest windowRows rows, dropping the older ones loaded
    /// since (call it when the view is back at the newest row); arrivals
    /// then drop the oldest row again. Does nothing while following.
    void followNewest();

Q_SIGNALS:
    void clientChanged();
    void conversationChanged();
    void countChanged();
    void loadingOlderChanged();
    void windowRowsChanged();
    void followingNewestChanged();

private:
    void refreshOnce();
    void holdOlder();
    std::unique_ptr<MessageListModelPrivate> d;
};

} // namespace im
