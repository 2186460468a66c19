//! One read transaction for one answer.
//!
//! A profile combines the store's state (how far the roll-ups reach, what
//! retention deleted), the roll-ups and the raw records, and the frames
//! they name. Read in separate transactions, a commit of the writer between
//! two of them (records rolled up, hours merged into days, records deleted)
//! would count requests twice or not at all. A [`Snapshot`] is a
//! connection of its own in one read transaction: every read of one answer
//! sees the store as one commit left it, whatever the writer does
//! meanwhile. Its reads never block the writer (WAL readers do not); while
//! it is open the WAL cannot be checkpointed past it, so an answer holds one
//! only for as long as it reads.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::{StoreError, open_reader};

/// A read transaction on a connection of its own, ended when dropped.
#[derive(Debug)]
pub(super) struct Snapshot {
    conn: Connection,
    path: PathBuf,
}

impl Snapshot {
    /// Open a connection to the store at `path` and begin a read
    /// transaction whose snapshot is taken at once.
    pub(super) fn begin(path: &Path) -> Result<Snapshot, StoreError> {
        let sqlite = |context| {
            move |source| StoreError::Sqlite {
                path: path.to_path_buf(),
                context,
                source,
            }
        };
        let conn = open_reader(path).map_err(sqlite("open reader"))?;
        let _ = conn.busy_timeout(std::time::Duration::from_secs(10));
        conn.execute_batch("BEGIN").map_err(sqlite("begin read"))?;
        // A deferred transaction takes its snapshot at its first read.
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(sqlite("begin read"))?;
        Ok(Snapshot {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// The connection, inside the transaction.
    pub(super) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The store's file, for errors.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// An error of this snapshot's store.
    pub(super) fn sqlite(
        &self,
        context: &'static str,
    ) -> impl FnOnce(rusqlite::Error) -> StoreError {
        let path = self.path.clone();
        move |source| StoreError::Sqlite {
            path,
            context,
            source,
        }
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        // A read transaction: ending it cannot lose anything.
        let _ = self.conn.execute_batch("COMMIT");
    }
}
