"""The artifact on disk: packing (staging + atomic rename), hashing, signing, verification."""
