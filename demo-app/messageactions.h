// Replies, edits and reactions in the message view (contract section 12,
// docs/demo-app.md, "Replies, edits, reactions"): the context-menu actions
// (Reply, Edit, React with a few emoji, and a QA action that reacts with 21
// distinct emoji), the composer bar above the send box ("Replying to ...",
// "Editing ..." with a cancel button), reaction chip clicks, and the outcome
// of each edit and reaction (the server's code for a refused one) in a label
// and the status bar.
#pragma once

#include <im/types.h>

#include <QtCore/QHash>
#include <QtCore/QModelIndex>
#include <QtCore/QSet>
#include <QtWidgets/QWidget>

namespace im {
class Client;
}

class QLabel;
class QLineEdit;
class QMenu;
class QPushButton;

class MessageActions : public QWidget {
    Q_OBJECT
public:
    /// What the send box does with the next text.
    enum class Mode { Send, Reply, Edit };

    /// The emoji the React menu offers.
    static const QStringList &quickEmoji();
    /// The 21 distinct emoji of the QA action (one past the limit of 20).
    static const QStringList &manyEmoji();

    /// `sendEdit` / `sendButton`: the panel's send box, which the composer
    /// fills (an edit starts from the current body) and relabels.
    MessageActions(im::Client *client, QLineEdit *sendEdit, QPushButton *sendButton, QWidget *parent = nullptr);

    /// Adds Reply, Edit, React and the QA reaction action for the timeline
    /// row `src` (a MessageListModel index) of conversation `conv`.
    void addToMenu(QMenu *menu, const QModelIndex &src, const QString &conv);

    Mode mode() const { return mode_; }
    /// Sends `text` as the reply / edit being composed; returns the cmid
    /// (empty: not queued, the reason in the status bar). Back to Send mode
    /// once queued.
    QString submit(const QString &text);
    /// Back to plain sending (the cancel button, Escape, another conversation).
    void cancelCompose();

    /// Turns our reaction `emoji` on the row `src` on or off (a chip click,
    /// the React menu); returns the cmid or empty.
    QString react(const QModelIndex &src, const QString &conv, const QString &emoji, bool on);
    /// The QA action: reacts with manyEmoji() on `src`; past 20 distinct
    /// emoji of ours the server answers INVALID_ARGUMENT.
    void reactMany(const QModelIndex &src, const QString &conv);

    /// The last outcome shown ("Edit of seq 12 (request 1a2b3c4d): Failed: NOT_SENDER").
    QString lastResult() const;

Q_SIGNALS:
    void statusMessage(const QString &text, int timeoutMs);

private:
    struct Target {
        QString conv;
        qint64 seq = 0;
        QString cmid; ///< our message's cmid (edits/reactions of a Pending one)
        bool own = false;
    };
    struct Batch {
        QString what;
        int left = 0;
        int sent = 0;
        QMap<QString, int> failed; ///< code -> count
    };
    static Target targetOf(const QModelIndex &src, const QString &conv);
    static QString describe(const Target &t);
    void startReply(const Target &t, const QString &sender, const QString &text);
    void startEdit(const Target &t, const QString &body);
    void showCompose(const QString &text);
    void track(const QString &cmid, const QString &what, int batch = 0);
    void settled(const QString &cmid, qint64 seq, im::MessageState state, const QString &code);
    void showResult(const QString &text);

    im::Client *client_;
    QLineEdit *sendEdit_;
    QPushButton *sendButton_;
    QLabel *composeLabel_;
    QPushButton *composeCancel_;
    QWidget *composeBar_;
    QLabel *resultLabel_;
    Mode mode_ = Mode::Send;
    Target target_;
    QHash<QString, QPair<QString, int>> tracked_; ///< cmid -> (what, batch id)
    QHash<int, Batch> batches_;
    int nextBatch_ = 1;
};
